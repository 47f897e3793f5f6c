package e2e

import (
	"net"
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
)

// Issue 26: after `make run` restarted, a second terminal's $TOKEN failed with "token signature
// is invalid" and its $DATABASE_URL with "PostgreSQL is unavailable", and nothing said to
// source bin/run.env again. Now the development secret is kept (bin/dev-jwt-secret, mode
// 0600, made once) and the throwaway PostgreSQL takes the last run's port when it is free, so
// the old variables keep working; when something did change the banner names it, and a pgsse
// command that fails in the old terminal says to source bin/run.env again.
func TestMakeRun_RestartKeepsASecondTerminalWorking(t *testing.T) {
	t.Parallel()
	dir := copyRepo(t)
	env := userEnv("PGSSE_LISTEN=127.0.0.1:"+strconv.Itoa(freePort(t)), "PGSSE_ADMIN_LISTEN=127.0.0.1:"+strconv.Itoa(freePort(t)))
	runEnv := filepath.Join(dir, "bin", "run.env")
	makeRun := func() (*bg, string) {
		t.Helper()
		run := startBG(t, dir, env, "make", "run")
		run.waitOutput(t, 4*time.Minute, "make run's banner", func(s string) bool { return strings.Contains(s, "Ctrl-C stops pgsse") })
		return run, run.stdout.String()
	}
	// oldTerminal runs a command in a shell that sourced saved, an earlier bin/run.env.
	oldTerminal := func(saved, command string) (string, error) {
		cmd := exec.Command("bash", "-o", "pipefail", "-c", "source "+saved+"\n"+command)
		cmd.Dir, cmd.Env = dir, env
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	save := func(name string) string {
		t.Helper()
		data, err := os.ReadFile(runEnv)
		require.NoError(t, err)
		path := filepath.Join(t.TempDir(), name)
		require.NoError(t, os.WriteFile(path, data, 0o600))
		return path
	}
	value := func(envFile, name string) string {
		out, err := exec.Command("bash", "-c", "source "+envFile+" && printf %s \"$"+name+"\"").Output()
		require.NoError(t, err)
		return string(out)
	}
	subscribe := `curl -s -o /dev/null -m 3 -w '%{http_code}' -H "Authorization: Bearer $TOKEN" "$PGSSE_URL/streams/demo" || true`

	run, banner := makeRun()
	assert.NotContains(t, banner, "since the last make run", "a first run has nothing to compare with")
	first := save("first.env")
	st, err := os.Stat(filepath.Join(dir, "bin", "dev-jwt-secret"))
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o600), st.Mode().Perm(), "the development secret is private")
	run.stop(syscall.SIGINT)

	// A restart: the old terminal's token and database still work.
	run, banner = makeRun()
	assert.Contains(t, banner, "A terminal that sourced bin/run.env during the last make run keeps working")
	second := save("second.env")
	assert.Equal(t, value(first, "PGSSE_JWT_SECRET"), value(second, "PGSSE_JWT_SECRET"), "the same development secret")
	assert.Equal(t, value(first, "DATABASE_URL"), value(second, "DATABASE_URL"), "the throwaway PostgreSQL got its port back")
	assert.Equal(t, value(first, "PGSSE_HUB_SOCKET"), value(second, "PGSSE_HUB_SOCKET"))
	out, _ := oldTerminal(first, subscribe)
	assert.Equal(t, "200", out, "the first run's $TOKEN subscribes to the second run")
	out, err = oldTerminal(first, "bin/pgsse publish demo 'from the old terminal'")
	assert.NoError(t, err, "the first run's $DATABASE_URL publishes to the second run: %s", out)
	run.stop(syscall.SIGINT)

	// The old port is taken meanwhile: the new one is named, and so is what to do.
	port := regexp.MustCompile(`:(\d+)/`).FindStringSubmatch(value(second, "DATABASE_URL"))
	require.Len(t, port, 2)
	taken, err := net.Listen("tcp", "127.0.0.1:"+port[1])
	require.NoError(t, err)
	defer taken.Close()
	run, banner = makeRun()
	taken.Close() // nothing listens there now: the old terminal's connection is refused at once
	assert.Contains(t, banner, "Changed since the last make run: DATABASE_URL (port "+port[1]+" was taken).")
	assert.Contains(t, banner, "In a terminal that sourced bin/run.env before: source bin/run.env again.")
	out, err = oldTerminal(second, "bin/pgsse publish demo 'to the old port'")
	require.Error(t, err, out)
	assert.Contains(t, out, "make run restarted with other values since this shell sourced "+runEnv+": source it again")
	assert.Equal(t, 1, strings.Count(strings.TrimSpace(out), "\n")+1, "one line: %s", out)
	third := save("third.env")
	out, err = oldTerminal(third, "bin/pgsse publish demo 'current'")
	assert.NoError(t, err, "a terminal that sourced the current bin/run.env works: %s", out)
	run.stop(syscall.SIGINT)

	// make run stopped: the terminal is told so.
	out, err = oldTerminal(third, "bin/pgsse publish demo 'nobody there'")
	require.Error(t, err, out)
	assert.Contains(t, out, "make run has stopped since this shell sourced "+runEnv)
	if t.Failed() {
		t.Logf("last make run:\n%s\n%s", tail(run.stdout.String(), 4000), tail(run.stderr.String(), 4000))
	}
}
