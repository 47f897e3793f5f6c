package e2e

// The documentation is tested like code (`make docs-check` runs these tests alone):
//
//   - Every fenced block in README.md and docs/*.md whose info string starts with `sh` is run
//     by TestDocs_MakeRunTwiceAndTheCommandsWork, verbatim, in bash (-e -o pipefail), from the
//     root of a fresh copy of the repository in which `make run` is running, after
//     `source bin/run.env` — exactly what a user has after the README's first step. Blocks run
//     in document order, each in a fresh shell.
//   - ```sh watch       a command that keeps running (curl -N, a worker): started in the
//     background; it must print something within 20 s (pgsse writes `retry:` once the
//     subscription is live, so what is published next reaches it), and is stopped at the end
//     of its file. An HTML comment `<!-- expect: TEXT -->` after it (invisible on the
//     rendered page) names output it must show by then.
//   - ```sh no-run: REASON   not run, with the reason (it starts a server itself, needs a
//     container runtime, changes the machine, …).
//   - `bash`, `shell`, `console` and `zsh` fences are refused: mark them as above.
//   - Other blocks (sql, json, nginx, text) are not shell; some are run by their own tests
//     (the browser example, the nginx snippet, the Python hub client).
//
// No link in a tracked Markdown file may point outside the repository.

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgsse/pgsse/internal/testkit"
	"github.com/pgsse/pgsse/internal/testkit/pgtest"
)

// mdBlock is one fenced code block of a Markdown file.
type mdBlock struct {
	file    string // relative to the repository root
	line    int    // of the opening fence, 1-based
	info    string // the fence's info string, e.g. "sh watch"
	body    string
	expects []string // sh watch: from <!-- expect: … --> comments after the block
}

func (b mdBlock) lang() string {
	f := strings.Fields(b.info)
	if len(f) == 0 {
		return ""
	}
	return f[0]
}

func (b mdBlock) where() string { return fmt.Sprintf("%s:%d", b.file, b.line) }

var expectComment = regexp.MustCompile(`^<!-- expect: (.+) -->$`)

// mdBlocks parses the fenced blocks (``` at the start of a line) of a Markdown file.
func mdBlocks(t *testing.T, rel string) []mdBlock {
	t.Helper()
	f, err := os.Open(filepath.Join(repoRoot, rel))
	require.NoError(t, err)
	defer f.Close()
	var blocks []mdBlock
	var cur *mdBlock
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		switch {
		case cur == nil && strings.HasPrefix(line, "```"):
			cur = &mdBlock{file: rel, line: n, info: strings.TrimSpace(strings.TrimPrefix(line, "```"))}
		case cur != nil && strings.TrimSpace(line) == "```":
			blocks = append(blocks, *cur)
			cur = nil
		case cur != nil:
			cur.body += line + "\n"
		default:
			if m := expectComment.FindStringSubmatch(strings.TrimSpace(line)); m != nil {
				require.NotEmpty(t, blocks, "%s:%d: an expect comment before any block", rel, n)
				last := &blocks[len(blocks)-1]
				require.Equal(t, "sh watch", last.info, "%s:%d: an expect comment must follow a ```sh watch block", rel, n)
				last.expects = append(last.expects, m[1])
			}
		}
	}
	require.NoError(t, sc.Err())
	require.Nil(t, cur, "%s: a fenced block is not closed", rel)
	return blocks
}

// docsBlock is the body of the one block of file whose info string is info (or whose language
// is info, when info is one word).
func docsBlock(t *testing.T, file, info string) string {
	t.Helper()
	var found []string
	for _, b := range mdBlocks(t, file) {
		if b.info == info || (!strings.Contains(info, " ") && b.lang() == info) {
			found = append(found, b.body)
		}
	}
	require.Len(t, found, 1, "%s must have exactly one ```%s block", file, info)
	return found[0]
}

// docFiles are the pages whose shell blocks are run: README.md and docs/*.md.
func docFiles(t *testing.T) []string {
	t.Helper()
	files := []string{"README.md"}
	docs, err := filepath.Glob(filepath.Join(repoRoot, "docs", "*.md"))
	require.NoError(t, err)
	require.NotEmpty(t, docs, "docs/*.md")
	for _, d := range docs {
		files = append(files, filepath.Join("docs", filepath.Base(d)))
	}
	return files
}

// trackedFiles lists the repository's files as git knows them (the work tree's content).
func trackedFiles(t *testing.T) []string {
	t.Helper()
	out, err := exec.Command("git", "-C", repoRoot, "ls-files", "-z", "--cached", "--others", "--exclude-standard").Output()
	require.NoError(t, err, "git ls-files (the docs tests need a git checkout)")
	var files []string
	for _, f := range strings.Split(string(out), "\x00") {
		if f == "" {
			continue
		}
		if _, err := os.Lstat(filepath.Join(repoRoot, f)); err == nil { // deleted but not yet committed
			files = append(files, f)
		}
	}
	return files
}

// Every shell block is marked: run, watched, or skipped with a reason.
func TestDocs_ShellBlocksAreMarked(t *testing.T) {
	runnable := 0
	for _, file := range docFiles(t) {
		for _, b := range mdBlocks(t, file) {
			switch b.lang() {
			case "bash", "shell", "console", "zsh":
				t.Errorf("%s: a ```%s block: write ```sh (run by make docs-check), ```sh watch, or ```sh no-run: REASON", b.where(), b.info)
			case "sh":
				switch {
				case b.info == "sh", b.info == "sh watch":
					runnable++
				case strings.HasPrefix(b.info, "sh no-run:"):
					assert.NotEmpty(t, strings.TrimSpace(strings.TrimPrefix(b.info, "sh no-run:")), "%s: no-run needs a reason", b.where())
				default:
					t.Errorf("%s: unknown marking ```%s (sh, sh watch or sh no-run: REASON)", b.where(), b.info)
				}
			}
		}
	}
	assert.Greater(t, runnable, 10, "the docs show commands to run")
}

var mdLink = regexp.MustCompile(`\]\(([^)\s]+)(?:\s+"[^"]*")?\)|<(https?://[^>]+)>`)

// No link in the repository's Markdown points outside it: relative links resolve to files
// (or directories) of the repository, and there are no links to the web.
func TestDocs_LinksStayInRepository(t *testing.T) {
	checked := 0
	for _, file := range trackedFiles(t) {
		if !strings.HasSuffix(file, ".md") {
			continue
		}
		data, err := os.ReadFile(filepath.Join(repoRoot, file))
		require.NoError(t, err)
		inFence := false
		for n, line := range strings.Split(string(data), "\n") {
			if strings.HasPrefix(line, "```") {
				inFence = !inFence
				continue
			}
			if inFence {
				continue
			}
			line = regexp.MustCompile("`[^`]*`").ReplaceAllString(line, "") // code spans are not links
			for _, m := range mdLink.FindAllStringSubmatch(line, -1) {
				target := m[1] + m[2]
				where := fmt.Sprintf("%s:%d", file, n+1)
				checked++
				if u, err := url.Parse(target); err != nil || u.Scheme != "" || strings.HasPrefix(target, "//") {
					t.Errorf("%s: link %q points outside the repository", where, target)
					continue
				}
				path, _, _ := strings.Cut(target, "#")
				if path == "" {
					continue // an anchor on the same page
				}
				abs := filepath.Clean(filepath.Join(repoRoot, filepath.Dir(file), path))
				if rel, err := filepath.Rel(repoRoot, abs); err != nil || rel == ".." || strings.HasPrefix(rel, "../") {
					t.Errorf("%s: link %q leaves the repository", where, target)
					continue
				}
				if _, err := os.Stat(abs); err != nil {
					t.Errorf("%s: link %q: %v", where, target, err)
				}
			}
		}
	}
	assert.Greater(t, checked, 10, "links checked")
}

// No tracked text file keeps the markers of a merge conflict resolved by hand: Go files would
// not build, but a Markdown page (a row of docs/http.md's error table once did), a script or a
// rule file would ship them as text.
func TestDocs_NoMergeConflictMarkers(t *testing.T) {
	checked := 0
	for _, file := range trackedFiles(t) {
		data, err := os.ReadFile(filepath.Join(repoRoot, file))
		require.NoError(t, err)
		if bytes.IndexByte(data, 0) >= 0 {
			continue // binary
		}
		checked++
		for n, line := range strings.Split(string(data), "\n") {
			line = strings.TrimSuffix(line, "\r")
			for _, m := range []string{"<<<<<<<", "=======", ">>>>>>>"} {
				if line == m || strings.HasPrefix(line, m+" ") {
					t.Errorf("%s:%d: a merge conflict marker: %q", file, n+1, line)
				}
			}
		}
	}
	assert.Greater(t, checked, 100, "files checked")
}

// The README stays one screen of introduction plus a tour: everything else is in docs/.
func TestDocs_ReadmeIsShort(t *testing.T) {
	data, err := os.ReadFile(filepath.Join(repoRoot, "README.md"))
	require.NoError(t, err)
	lines := strings.Count(string(data), "\n")
	assert.LessOrEqual(t, lines, 150, "README.md has %d lines", lines)
}

// docs/hub_worker.py (what make run suggests) is exactly the client shown in
// docs/hub-protocol.md.
func TestDocs_HubWorkerFileIsTheDocumentedClient(t *testing.T) {
	file, err := os.ReadFile(filepath.Join(repoRoot, "docs", "hub_worker.py"))
	require.NoError(t, err)
	assert.Equal(t, string(file), docsBlock(t, "docs/hub-protocol.md", "python file=docs/hub_worker.py"), "docs/hub-protocol.md and docs/hub_worker.py differ")
}

// docs/pgsse.service is a unit systemd accepts.
func TestDocs_SystemdUnitVerifies(t *testing.T) {
	analyze, err := exec.LookPath("systemd-analyze")
	if err != nil {
		t.Skip("systemd-analyze is not installed: cannot verify docs/pgsse.service")
	}
	unit, err := os.ReadFile(filepath.Join(repoRoot, "docs", "pgsse.service"))
	require.NoError(t, err)
	// verify checks that ExecStart's binary exists: point it at the one built for this run.
	// The environment file is the operator's; its absence is not the unit's fault.
	text := strings.ReplaceAll(string(unit), "/usr/local/bin/pgsse", pgsseBin(t))
	text = strings.ReplaceAll(text, "EnvironmentFile=/", "EnvironmentFile=-/")
	dir := t.TempDir()
	path := filepath.Join(dir, "pgsse.service")
	require.NoError(t, os.WriteFile(path, []byte(text), 0o644))
	out, err := exec.Command(analyze, "verify", path).CombinedOutput()
	require.NoError(t, err, "systemd-analyze verify: %s", out)
	assert.Empty(t, strings.TrimSpace(string(out)), "systemd-analyze verify warns")
	for _, want := range []string{"LimitNOFILE=", "NoNewPrivileges=yes", "ProtectSystem=strict", "RuntimeDirectory=pgsse"} {
		assert.Contains(t, string(unit), want)
	}
}

// copyRepo copies the repository's files (as tracked, with the work tree's content) into a
// fresh directory: a clean checkout with its own bin/, as a new user has.
func copyRepo(t *testing.T) string {
	t.Helper()
	dst := filepath.Join(t.TempDir(), "pgsse")
	for _, f := range trackedFiles(t) {
		src := filepath.Join(repoRoot, f)
		st, err := os.Lstat(src)
		require.NoError(t, err)
		if !st.Mode().IsRegular() {
			continue
		}
		require.NoError(t, os.MkdirAll(filepath.Join(dst, filepath.Dir(f)), 0o755))
		data, err := os.ReadFile(src)
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(filepath.Join(dst, f), data, st.Mode().Perm()))
	}
	return dst
}

// userEnv is the environment a user's shell has: nothing of pgsse's, no database.
func userEnv(extra ...string) []string {
	var env []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(k, "PGSSE_") || strings.HasPrefix(k, "PG") || k == "DATABASE_URL" || k == "TOKEN" || k == "MAKEFLAGS" || k == "MAKELEVEL" {
			continue
		}
		env = append(env, kv)
	}
	return append(env, extra...)
}

// bg is a process group running in the background, its output recorded.
type bg struct {
	cmd            *exec.Cmd
	stdout, stderr *testkit.SyncBuffer
	exited         chan struct{}
}

func startBG(t *testing.T, dir string, env []string, name string, args ...string) *bg {
	t.Helper()
	p := &bg{stdout: &testkit.SyncBuffer{}, stderr: &testkit.SyncBuffer{}, exited: make(chan struct{})}
	p.cmd = exec.Command(name, args...)
	p.cmd.Dir, p.cmd.Env = dir, env
	p.cmd.Stdout, p.cmd.Stderr = p.stdout, p.stderr
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	require.NoError(t, p.cmd.Start())
	go func() { _ = p.cmd.Wait(); close(p.exited) }()
	t.Cleanup(func() { p.stop(syscall.SIGKILL) })
	return p
}

// stop signals the whole group (as Ctrl-C does) and waits; SIGKILL after 20 s.
func (p *bg) stop(sig syscall.Signal) {
	select {
	case <-p.exited:
		return
	default:
	}
	_ = syscall.Kill(-p.cmd.Process.Pid, sig)
	select {
	case <-p.exited:
	case <-time.After(20 * time.Second):
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
		<-p.exited
	}
}

// waitOutput polls until cond holds on stdout; fails after d or if the process exits first.
func (p *bg) waitOutput(t *testing.T, d time.Duration, what string, cond func(string) bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond(p.stdout.String()) {
		select {
		case <-p.exited:
			if cond(p.stdout.String()) {
				return
			}
			t.Fatalf("%s: exited (%v) first\nstdout:\n%s\nstderr:\n%s", what, p.cmd.ProcessState, tail(p.stdout.String(), 3000), tail(p.stderr.String(), 3000))
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %s\nstdout:\n%s\nstderr:\n%s", what, d, tail(p.stdout.String(), 3000), tail(p.stderr.String(), 3000))
		}
		time.Sleep(50 * time.Millisecond) // polling the output: it is the observable
	}
}

// shellFor is the bash command line that runs a block as a user would, after the README's
// `source bin/run.env`.
func shellFor(body string) []string {
	return []string{"-e", "-o", "pipefail", "-c", "source bin/run.env\n" + body}
}

// TestDocs_MakeRunTwiceAndTheCommandsWork: `make run` in a fresh copy of the repository; a
// second `make run` there refuses with one line and no banner, and so does one in another
// copy whose ports are taken; then every runnable shell block of README.md and docs/ runs,
// verbatim, against the first.
func TestDocs_MakeRunTwiceAndTheCommandsWork(t *testing.T) {
	dir := copyRepo(t)
	ports := []string{"PGSSE_LISTEN=127.0.0.1:" + strconv.Itoa(freePort(t)), "PGSSE_ADMIN_LISTEN=127.0.0.1:" + strconv.Itoa(freePort(t))}
	env := userEnv(ports...)
	run := startBG(t, dir, env, "make", "run")
	run.waitOutput(t, 4*time.Minute, "make run's banner", func(s string) bool { return strings.Contains(s, "pgsse is running") })
	banner := run.stdout.String()
	assert.Contains(t, banner, "source bin/run.env")
	assert.Contains(t, banner, "python3 docs/hub_worker.py")
	envFile, err := os.ReadFile(filepath.Join(dir, "bin", "run.env"))
	require.NoError(t, err)
	for _, v := range []string{"DATABASE_URL", "PGSSE_DATABASE_URL", "PGSSE_JWT_SECRET", "PGSSE_HUB_SOCKET", "PGSSE_URL", "PGSSE_ADMIN_URL", "TOKEN"} {
		assert.Contains(t, string(envFile), "export "+v+"=")
	}

	refuses := func(dir, want string) {
		t.Helper()
		cmd := exec.Command("make", "run")
		cmd.Dir, cmd.Env = dir, env
		out, err := cmd.CombinedOutput()
		require.Error(t, err, "a second make run must fail:\n%s", out)
		var ours []string // make's own "make: *** [...] Error 1" is not ours
		for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n") {
			if !strings.HasPrefix(l, "make: ") && !strings.HasPrefix(l, "make[") {
				ours = append(ours, l)
			}
		}
		require.Len(t, ours, 1, "one line, no banner:\n%s", out)
		assert.Contains(t, ours[0], want)
		assert.NotContains(t, string(out), "pgsse is running")
		assert.NotContains(t, string(out), "PostgreSQL")
	}
	refuses(dir, "another make run is running in this directory")
	refuses(copyRepo(t), "is in use by another program")
	// The refusals left the first run's variables alone.
	after, err := os.ReadFile(filepath.Join(dir, "bin", "run.env"))
	require.NoError(t, err)
	assert.Equal(t, string(envFile), string(after))

	for _, file := range docFiles(t) {
		t.Run(file, func(t *testing.T) {
			var watches []*bg
			var watchBlocks []mdBlock
			for _, b := range mdBlocks(t, file) {
				switch b.info {
				case "sh":
					cmd := exec.Command("bash", shellFor(b.body)...)
					cmd.Dir, cmd.Env = dir, env
					done := make(chan struct{})
					timer := time.AfterFunc(2*time.Minute, func() {
						select {
						case <-done:
						default:
							_ = cmd.Process.Kill()
						}
					})
					out, err := cmd.CombinedOutput()
					close(done)
					timer.Stop()
					require.NoError(t, err, "%s: the block failed:\n%s\noutput:\n%s", b.where(), b.body, out)
					t.Logf("%s:\n%s%s", b.where(), b.body, out)
				case "sh watch":
					w := startBG(t, dir, env, "bash", shellFor(b.body)...)
					w.waitOutput(t, 20*time.Second, b.where()+" (a watch) printing its first line", func(s string) bool { return strings.Contains(s, "\n") })
					watches, watchBlocks = append(watches, w), append(watchBlocks, b)
				}
			}
			for i, w := range watches {
				for _, want := range watchBlocks[i].expects {
					w.waitOutput(t, 15*time.Second, fmt.Sprintf("%s shows %q", watchBlocks[i].where(), want), func(s string) bool { return strings.Contains(s, want) })
				}
				w.stop(syscall.SIGTERM)
				t.Logf("%s (watch):\n%s%s", watchBlocks[i].where(), watchBlocks[i].body, w.stdout.String())
			}
		})
	}

	// Ctrl-C: everything stops, and the variables file goes with it.
	run.stop(syscall.SIGINT)
	_, err = os.Stat(filepath.Join(dir, "bin", "run.env"))
	assert.ErrorIs(t, err, fs.ErrNotExist, "bin/run.env is removed when make run stops")
	if t.Failed() {
		t.Logf("make run output:\n%s\n%s", tail(run.stdout.String(), 6000), tail(run.stderr.String(), 6000))
	}
}

// The browser example of docs/http.md, extracted from the Markdown and served as written:
// it shows replayed, live and named events, survives a pgsse restart by reconnecting with
// Last-Event-ID, and reports the gap when the events it missed were pruned meanwhile.
func TestDocs_BrowserExampleHandlesReconnectsAndGaps(t *testing.T) {
	t.Parallel()
	page := docsBlock(t, "docs/http.md", "html browser-example")
	ps := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		_, _ = io.WriteString(w, page)
	}))
	t.Cleanup(ps.Close)

	dsn := newDatabase(t)
	s := startServer(t, dsn, "127.0.0.1", "--cors-origins", ps.URL)
	token := mintToken(t, "orders/*")
	publishSQL(t, dsn, "orders/42", "created")

	b := startChromium(t, s)
	b.call(map[string]any{"cmd": "goto", "url": ps.URL + "/?pgsse=" + url.QueryEscape(s.Origin()) + "&stream=orders/42&token=" + url.QueryEscape(token)})
	text := func(id string) string {
		var v string
		raw := b.call(map[string]any{"cmd": "eval", "expr": "document.getElementById('" + id + "').innerText"})
		require.NoError(t, json.Unmarshal(raw, &v))
		return v
	}
	waitPage := func(what string, cond func(events, state string) bool) {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for {
			ev, st := text("events"), text("state")
			if cond(ev, st) {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("example page: %s; state %q, events:\n%s", what, st, ev)
			}
			time.Sleep(100 * time.Millisecond) // polling the page: its DOM is the observable
		}
	}
	waitPage("replayed event 1", func(ev, st string) bool { return st == "open" && strings.Contains(ev, "#1 message: created") })
	publishCLI(t, dsn, "orders/42", "out for delivery", "--event", "status")
	waitPage("the named event 2", func(ev, _ string) bool { return strings.Contains(ev, "#2 status: out for delivery") })

	// pgsse goes away; meanwhile events 3..5 are published and 3..4 pruned.
	s.Stop()
	waitPage("the reconnecting state", func(_, st string) bool { return st == "reconnecting" })
	for _, d := range []string{"packed", "left the depot", "delivered"} {
		publishSQL(t, dsn, "orders/42", d)
	}
	pgtest.Exec(t, dsn, "SELECT pgsse.prune(interval '0', keep_last => 1)")
	s.Start()
	waitPage("the gap and event 5 after the reconnect", func(ev, st string) bool {
		return st == "open" && strings.Contains(ev, "#5 message: delivered")
	})
	ev := text("events")
	assert.Contains(t, ev, "gap: events after 2 up to 4 were pruned")
	assert.Less(t, strings.Index(ev, "gap:"), strings.Index(ev, "#5 message: delivered"), "the gap comes first")
	assert.NotContains(t, ev, "packed")
	assert.Equal(t, 1, strings.Count(ev, "#1 message: created"), "nothing twice")
	all, _ := b.snapshot()
	var lastIDs []string
	for _, r := range filter(all, "request") {
		lastIDs = append(lastIDs, r.Headers["last-event-id"])
	}
	require.NotEmpty(t, lastIDs)
	assert.Equal(t, "2", lastIDs[len(lastIDs)-1], "the browser reconnected with Last-Event-ID")
	png := filepath.Join(artifactsDir(t), "docs-browser-example.png")
	b.call(map[string]any{"cmd": "screenshot", "path": png})
}
