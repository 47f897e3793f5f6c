package e2e

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgsse/pgsse/internal/testkit"
	"github.com/pgsse/pgsse/internal/testkit/servetest"
)

// The README's curl examples, exactly as a user copies them after `source bin/run.env`
// ($PGSSE_URL and $TOKEN set; e2e/docs_test.go runs the whole tour against make run).
const (
	readmeCurlBearer = `curl -N -H "Authorization: Bearer $TOKEN" "$PGSSE_URL/streams/demo"`
	readmeCurlResume = `curl -N -H "Last-Event-ID: 1" "$PGSSE_URL/streams/demo?token=$TOKEN"`
)

// runReadmeCurl runs one README command through bash with TOKEN exported, against s
// (listening on all addresses, like the default --listen :8080), and returns its stdout
// as SSE items. curl is killed when the test ends.
func runReadmeCurl(t *testing.T, s *servetest.Server, command, token string) <-chan sseItem {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	cmd := exec.CommandContext(ctx, "bash", "-c", "exec "+command)
	cmd.Env = append(os.Environ(), "TOKEN="+token, "PGSSE_URL=http://localhost:"+strconv.Itoa(s.Port()))
	stderr := &testkit.SyncBuffer{}
	cmd.Stderr = stderr
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start(), command)
	items := readSSE(stdout)
	t.Cleanup(func() {
		cancel()
		for range items {
		}
		_ = cmd.Wait()
		if t.Failed() {
			t.Logf("%s\ncurl stderr: %s", command, stderr.String())
		}
	})
	return items
}

// `curl -N -H "Authorization: Bearer $TOKEN" http://localhost:8080/streams/demo` prints
// the retry line at once, then live events as they are published.
func TestCurl_READMEBearerHeaderCommand(t *testing.T) {
	t.Parallel()
	dsn := newDatabase(t)
	s := startServer(t, dsn, "")
	token := mintToken(t, "demo")
	publishSQL(t, dsn, "demo", "before: not shown (live only)")

	items := runReadmeCurl(t, s, readmeCurlBearer, token)
	retry := nextItem(t, items, 10*time.Second, "the retry: line", func(it sseItem) bool { return it.Kind == "retry" })
	assert.Equal(t, "2000", retry.Retry)

	publishSQL(t, dsn, "demo", "hello")
	publishCLI(t, dsn, "demo", "world", "--event", "greeting")
	ev := nextItem(t, items, 5*time.Second, "event 2", func(it sseItem) bool { return it.Kind == "event" })
	assert.Equal(t, sseItem{Kind: "event", ID: "2", HasID: true, Event: "message", Data: "hello"}, withoutTime(ev))
	ev = nextItem(t, items, 5*time.Second, "event 3", func(it sseItem) bool { return it.Kind == "event" })
	assert.Equal(t, sseItem{Kind: "event", ID: "3", HasID: true, Event: "greeting", Data: "world"}, withoutTime(ev))
}

// `curl -N -H "Last-Event-ID: 1" "$PGSSE_URL/streams/demo?token=$TOKEN"` resumes after
// event 1, as a reconnecting browser does, then goes on live.
func TestCurl_READMEResumeCommand(t *testing.T) {
	t.Parallel()
	dsn := newDatabase(t)
	s := startServer(t, dsn, "")
	token := mintToken(t, "demo")
	publishSQL(t, dsn, "demo", "one")
	publishSQL(t, dsn, "demo", "two")

	items := runReadmeCurl(t, s, readmeCurlResume, token)
	nextItem(t, items, 10*time.Second, "the retry: line", func(it sseItem) bool { return it.Kind == "retry" })
	ev := nextItem(t, items, 5*time.Second, "replayed event 2", func(it sseItem) bool { return it.Kind == "event" })
	assert.Equal(t, sseItem{Kind: "event", ID: "2", HasID: true, Event: "message", Data: "two"}, withoutTime(ev))
	publishSQL(t, dsn, "demo", "three")
	ev = nextItem(t, items, 5*time.Second, "live event 3", func(it sseItem) bool { return it.Kind == "event" })
	assert.Equal(t, sseItem{Kind: "event", ID: "3", HasID: true, Event: "message", Data: "three"}, withoutTime(ev))
}

// The commands tested above are the ones the README shows.
func TestCurl_READMEShowsTheTestedCommands(t *testing.T) {
	readme, err := os.ReadFile(filepath.Join(repoRoot, "README.md"))
	require.NoError(t, err, "README.md must exist and show the curl examples")
	for _, c := range []string{readmeCurlBearer, readmeCurlResume} {
		assert.Contains(t, string(readme), c, "README.md must show this command exactly (e2e/curl_test.go runs it)")
	}
}

func withoutTime(it sseItem) sseItem {
	it.At = time.Time{}
	return it
}
