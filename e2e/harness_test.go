package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgsse/pgsse/internal/testkit"
	"github.com/pgsse/pgsse/internal/testkit/pgtest"
	"github.com/pgsse/pgsse/internal/testkit/servetest"
	"github.com/pgsse/pgsse/internal/testkit/ssetest"
	"github.com/pgsse/pgsse/store"
)

// testSecret signs every token in this suite (HS256).
const testSecret = "e2e-secret-0123456789abcdef0123456789abcdef"

// freePort is a TCP port on 127.0.0.1, below the ephemeral range, for a program the test
// starts (nginx, Caddy) to bind (internal/testkit).
var freePort = testkit.FreePort

// tail returns at most the last n bytes of s, for failure messages.
var tail = testkit.Tail

// pgsseBin is cmd/pgsse built for this run (once), with -race when the tests run with it:
// real clients drive a race-checked server.
func pgsseBin(t testing.TB) string {
	t.Helper()
	return servetest.Binary(t, servetest.RaceEnabled)
}

// runPGSSE runs a short pgsse subcommand and returns its trimmed stdout.
func runPGSSE(t testing.TB, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, pgsseBin(t), args...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	require.NoError(t, cmd.Run(), "pgsse %s: %s", strings.Join(args, " "), stderr.String())
	return strings.TrimSpace(stdout.String())
}

// newDatabase is a fresh database with the pgsse schema.
func newDatabase(t testing.TB) string {
	t.Helper()
	return pgtest.Migrated(t, store.Migrate)
}

// mintToken mints a token for stream patterns with `pgsse token` and the test secret.
func mintToken(t testing.TB, streams ...string) string {
	t.Helper()
	args := []string{"token", "--jwt-secret", testSecret, "--ttl", "1h"}
	for _, s := range streams {
		args = append(args, "--stream", s)
	}
	tok := runPGSSE(t, args...)
	require.NotEmpty(t, tok)
	return tok
}

func sqlQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }

// publishSQL publishes a durable event with pgsse.publish and returns its id.
func publishSQL(t testing.TB, dsn, stream, data string) int64 {
	t.Helper()
	v := pgtest.QueryValue(t, dsn, "SELECT pgsse.publish("+sqlQuote(stream)+", "+sqlQuote(data)+")")
	id, err := strconv.ParseInt(v, 10, 64)
	require.NoError(t, err)
	return id
}

// publishCLI runs `pgsse publish STREAM DATA [extra flags]`.
func publishCLI(t testing.TB, dsn, stream, data string, extra ...string) string {
	t.Helper()
	return runPGSSE(t, append([]string{"publish", stream, data, "--database-url", dsn}, extra...)...)
}

// startServer starts `pgsse serve` (internal/testkit/servetest) on free ports against dsn with
// the test secret plus extra flags, waits until /readyz answers 200, and stops it when the
// test ends; its Stop and Start restart it on the same ports. listenHost is "127.0.0.1" (or
// another loopback address), or "" for all addresses, like the default :8080.
func startServer(t *testing.T, dsn, listenHost string, extra ...string) *servetest.Server {
	t.Helper()
	return servetest.Start(t, servetest.Options{
		Bin: pgsseBin(t), DSN: dsn, ListenHost: listenHost, AllAddresses: listenHost == "",
		Args: append([]string{"--jwt-secret", testSecret, "--retention", "0", "--log-level", "debug"}, extra...),
	})
}

// sseItem is one thing read from an SSE stream by readSSE.
type sseItem struct {
	At      time.Time
	Kind    string // "event", "comment", "retry", "eof"
	ID      string // event: the id field ("" when none)
	HasID   bool
	Event   string // event: the type ("message" by default)
	Data    string
	Retry   string // retry: the value
	Comment string
	Err     error // eof: why
}

// readSSE parses an SSE byte stream with internal/testkit/ssetest's parser into items on the
// returned channel — a comment or a retry: line as soon as it arrives, an event at its blank
// line —, closed after the "eof" item.
func readSSE(r io.Reader) <-chan sseItem {
	ch := make(chan sseItem, 1024)
	go func() {
		defer close(ch)
		s := ssetest.NewStream(r, nil)
		s.Eager = true
		for {
			b, err := s.Next(0)
			if err != nil {
				ch <- sseItem{At: time.Now(), Kind: "eof", Err: err}
				return
			}
			for _, c := range b.Comments {
				ch <- sseItem{At: b.At, Kind: "comment", Comment: c}
			}
			if b.Retry != "" {
				ch <- sseItem{At: b.At, Kind: "retry", Retry: b.Retry}
			}
			if b.HasData {
				ch <- sseItem{At: b.At, Kind: "event", ID: b.ID, HasID: b.HasID, Event: b.Name(), Data: b.Data}
			}
		}
	}()
	return ch
}

// nextItem returns the next item matching pred within d, failing the test otherwise.
// Items that do not match are appended to *skipped when skipped is not nil.
func nextItem(t testing.TB, ch <-chan sseItem, d time.Duration, what string, pred func(sseItem) bool) sseItem {
	t.Helper()
	timer := time.NewTimer(d)
	defer timer.Stop()
	var seen []string
	for {
		select {
		case it, ok := <-ch:
			if !ok {
				t.Fatalf("waiting for %s: stream ended; saw %v", what, seen)
			}
			if pred(it) {
				return it
			}
			seen = append(seen, fmt.Sprintf("%+v", it))
			if it.Kind == "eof" {
				t.Fatalf("waiting for %s: stream ended (%v); saw %v", what, it.Err, seen)
			}
		case <-timer.C:
			t.Fatalf("waiting for %s: nothing within %s; saw %v", what, d, seen)
		}
	}
}

func isEvent(id string) func(sseItem) bool {
	return func(it sseItem) bool { return it.Kind == "event" && it.ID == id }
}

// openStream opens a GET on url with the given headers and returns the response (its body
// is closed when the test ends) and the parsed stream.
func openStream(t testing.TB, url string, header http.Header) (*http.Response, <-chan sseItem) {
	t.Helper()
	tr := &http.Transport{DisableKeepAlives: true}
	t.Cleanup(tr.CloseIdleConnections)
	req, err := http.NewRequest(http.MethodGet, url, nil)
	require.NoError(t, err)
	for k, v := range header {
		req.Header[k] = v
	}
	resp, err := (&http.Client{Transport: tr}).Do(req)
	require.NoError(t, err)
	ch := readSSE(resp.Body)
	t.Cleanup(func() {
		resp.Body.Close()
		for range ch { // let the reader goroutine finish
		}
	})
	return resp, ch
}

// obs is one JSON line from a Node client script (es-client.mjs or chromium.mjs).
type obs struct {
	At   time.Time `json:"-"`
	Kind string    `json:"kind"` // open, event, error, closed; chromium: reply, request, response, console, …
	What string    `json:"what"` // chromium: the page's own kind before normalisation

	Type        string `json:"type"`
	Data        string `json:"data"`
	LastEventID string `json:"lastEventId"`
	ReadyState  int    `json:"readyState"`
	Message     string `json:"message"`
	Code        *int   `json:"code"`
	T           int64  `json:"t"` // chromium page: Date.now() in the browser

	URL          string            `json:"url"`
	Method       string            `json:"method"`
	ResourceType string            `json:"resourceType"`
	Headers      map[string]string `json:"headers"`
	Status       int               `json:"status"`
	Text         string            `json:"text"`

	// chromium: the tab (pages of one browser context) that reported it; the browser client's
	// test page (browser_client_test.go) also reports these.
	Page   int    `json:"page"`
	Stream string `json:"stream"`
	Seq    string `json:"seq"`  // the event's id in its stream
	Role   string `json:"role"` // holder, follower, alone

	ID    int             `json:"id"`
	OK    bool            `json:"ok"`
	Value json.RawMessage `json:"value"`
	Error string          `json:"error"`
}

func (o obs) String() string {
	switch o.Kind {
	case "event":
		return fmt.Sprintf("event(%s id=%q data=%q rs=%d)", o.Type, o.LastEventID, o.Data, o.ReadyState)
	case "open", "error", "closed":
		return fmt.Sprintf("%s(rs=%d %s)", o.Kind, o.ReadyState, o.Message)
	case "request":
		return fmt.Sprintf("request(%s %s last-event-id=%q)", o.Method, o.URL, o.Headers["last-event-id"])
	case "response":
		return fmt.Sprintf("response(%d %s)", o.Status, o.URL)
	case "reply":
		return fmt.Sprintf("reply(%d ok=%v %s%s)", o.ID, o.OK, o.Value, o.Error)
	case "client-event", "client-gap", "client-state", "client-open", "client-error", "client-presence":
		return fmt.Sprintf("tab %d %s(%s %s#%s %q rs=%d %s)", o.Page, o.Kind, o.Role, o.Stream, o.Seq, o.Data, o.ReadyState, o.Message)
	default:
		return fmt.Sprintf("%s(%s%s)", o.Kind, o.Text, o.URL)
	}
}

// nodeProc is a Node client script running under the test; it records every line it
// prints.
type nodeProc struct {
	t      *testing.T
	name   string
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	stderr *testkit.SyncBuffer
	exited chan struct{}

	mu      sync.Mutex
	all     []obs
	changed chan struct{} // closed and replaced whenever all grows or the process exits
	nextID  int
}

// startNode runs `node script argJSON` in e2e/js and stops it when the test ends.
func startNode(t *testing.T, script string, arg any) *nodeProc {
	t.Helper()
	js, err := json.Marshal(arg)
	require.NoError(t, err)
	cmd := exec.Command("node", script, string(js))
	cmd.Dir = jsDir
	p := &nodeProc{t: t, name: script, cmd: cmd, stderr: &testkit.SyncBuffer{}, exited: make(chan struct{}), changed: make(chan struct{})}
	cmd.Stderr = p.stderr
	p.stdin, err = cmd.StdinPipe()
	require.NoError(t, err)
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	go func() {
		sc := bufio.NewScanner(stdout)
		sc.Buffer(make([]byte, 0, 64<<10), 16<<20)
		for sc.Scan() {
			var o obs
			if err := json.Unmarshal(sc.Bytes(), &o); err != nil {
				o = obs{Kind: "garbage", Text: sc.Text()}
			}
			o.At = time.Now()
			if o.Kind == "page" {
				o.Kind = o.What
			}
			p.mu.Lock()
			p.all = append(p.all, o)
			close(p.changed)
			p.changed = make(chan struct{})
			p.mu.Unlock()
		}
		_ = cmd.Wait()
		p.mu.Lock()
		close(p.exited)
		close(p.changed)
		p.changed = make(chan struct{})
		p.mu.Unlock()
	}()
	t.Cleanup(func() {
		p.stdin.Close() // the scripts exit when stdin ends
		select {
		case <-p.exited:
		case <-time.After(15 * time.Second):
			_ = cmd.Process.Kill()
			<-p.exited
		}
		if t.Failed() || os.Getenv("PGSSE_E2E_VERBOSE") != "" {
			t.Logf("%s observed:\n%s\nstderr:\n%s", p.name, p.dump(), tail(p.stderr.String(), 4000))
		}
	})
	return p
}

func (p *nodeProc) snapshot() ([]obs, chan struct{}) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]obs(nil), p.all...), p.changed
}

func (p *nodeProc) dump() string {
	all, _ := p.snapshot()
	var b strings.Builder
	for _, o := range all {
		fmt.Fprintf(&b, "  %s %s\n", o.At.Format(time.TimeOnly+".000"), o)
	}
	return b.String()
}

// waitFor waits until cond holds over everything observed so far and returns that
// snapshot; it fails the test after d.
func (p *nodeProc) waitFor(d time.Duration, what string, cond func(all []obs) bool) []obs {
	p.t.Helper()
	deadline := time.NewTimer(d)
	defer deadline.Stop()
	for {
		all, changed := p.snapshot()
		if cond(all) {
			return all
		}
		select {
		case <-p.exited:
			all, _ := p.snapshot()
			if cond(all) {
				return all
			}
			p.t.Fatalf("%s exited while waiting for %s:\n%s\nstderr:\n%s", p.name, what, p.dump(), tail(p.stderr.String(), 4000))
		default:
		}
		select {
		case <-changed:
		case <-deadline.C:
			p.t.Fatalf("%s: waiting for %s: not within %s; observed:\n%s", p.name, what, d, p.dump())
		}
	}
}

// call sends a command to chromium.mjs and returns its reply's value.
func (p *nodeProc) call(cmd map[string]any) json.RawMessage {
	p.t.Helper()
	p.mu.Lock()
	p.nextID++
	id := p.nextID
	p.mu.Unlock()
	cmd["id"] = id
	line, err := json.Marshal(cmd)
	require.NoError(p.t, err)
	_, err = p.stdin.Write(append(line, '\n'))
	require.NoError(p.t, err)
	var reply obs
	p.waitFor(60*time.Second, fmt.Sprintf("the reply to %v", cmd["cmd"]), func(all []obs) bool {
		for _, o := range all {
			if o.Kind == "reply" && o.ID == id {
				reply = o
				return true
			}
		}
		return false
	})
	require.True(p.t, reply.OK, "%s %v: %s", p.name, cmd["cmd"], reply.Error)
	return reply.Value
}

// send writes one raw line to the script's stdin.
func (p *nodeProc) send(line string) {
	p.t.Helper()
	_, err := io.WriteString(p.stdin, line+"\n")
	require.NoError(p.t, err)
}

// filter returns the observations of one kind.
func filter(all []obs, kind string) []obs {
	var r []obs
	for _, o := range all {
		if o.Kind == kind {
			r = append(r, o)
		}
	}
	return r
}

// eventIDs lists the lastEventId of every event of the given type, in order.
func eventIDs(all []obs, typ string) []string {
	var ids []string
	for _, o := range filter(all, "event") {
		if o.Type == typ {
			ids = append(ids, o.LastEventID)
		}
	}
	return ids
}

// artifactsDir is e2e/artifacts (git-ignored), created on demand.
func artifactsDir(t testing.TB) string {
	t.Helper()
	dir := filepath.Join(repoRoot, "e2e", "artifacts")
	require.NoError(t, os.MkdirAll(dir, 0o755))
	return dir
}
