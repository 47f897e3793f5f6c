package servetest

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/pgsse/pgsse/internal/testkit/pgtest"
	"github.com/pgsse/pgsse/store"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.Cleanup(func(code int) {
		RemoveBinaries()
		os.Exit(code)
	}))
}

// A real `pgsse serve`: ready once /readyz says so, its metrics read, stopped with SIGTERM
// (exit 0), started again on the same port.
func TestServeStopStart(t *testing.T) {
	dsn := pgtest.Migrated(t, store.Migrate)
	s := Start(t, Options{DSN: dsn, Args: []string{"--public-streams", "*"}})
	code, body, err := get(http.DefaultClient, s.AdminURL("/readyz"))
	require.NoError(t, err)
	assert.Equal(t, 200, code, body)
	assert.Equal(t, 0.0, s.Metric("pgsse_sse_connections"))
	line := s.WaitLog(time.Second, "the start-up line", func(l map[string]any) bool { return l["msg"] == "pgsse serving" })
	assert.Equal(t, s.Listen, line["listen"])
	pid := s.PID()

	s.Signal(syscall.SIGTERM)
	assert.Equal(t, 0, s.WaitExit(30*time.Second))
	s.Stop()
	assert.Nil(t, s.Process())
	_, err = net.DialTimeout("tcp", s.Listen, time.Second)
	assert.Error(t, err, "stopped")

	s.Start()
	assert.NotEqual(t, pid, s.PID(), "a new process")
	resp, err := http.Get(s.URL("/streams/x"))
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, 200, resp.StatusCode, "serving on the same port again")
	assert.Equal(t, 2, strings.Count(s.Log(), "---- start "), "both runs in one log")
}

// recorder is a testing.TB whose Fatal ends only the goroutine that called it.
type recorder struct {
	testing.TB
	mu     sync.Mutex
	failed string
}

func (r *recorder) Helper() {}
func (r *recorder) Fatal(args ...any) {
	r.Fatalf("%s", fmt.Sprint(args...))
}
func (r *recorder) Fatalf(format string, args ...any) {
	r.mu.Lock()
	r.failed = fmt.Sprintf(format, args...)
	r.mu.Unlock()
	runtime.Goexit()
}

// A server that cannot start fails Start at once (when it exits, not after a timeout) with
// its log.
func TestStartFailsWithTheLog(t *testing.T) {
	bin := Binary(t, false)
	r := &recorder{TB: t}
	start := time.Now()
	done := make(chan struct{})
	go func() {
		defer close(done)
		Start(r, Options{Bin: bin, Args: []string{"--max-header-bytes", "x"}, Wait: WaitServing})
	}()
	<-done
	assert.Less(t, time.Since(start), 30*time.Second)
	assert.Contains(t, r.failed, "did not serve: the process ended")
	assert.Contains(t, r.failed, "--max-header-bytes", "the server's own line")
}

// WaitLine wakes on the line it waits for (no polling interval to wait out), and reports
// the end of the output.
func TestWaitLine(t *testing.T) {
	p, err := StartProcess(ProcessOptions{Path: "/bin/sh", Args: []string{"-c", "echo one; sleep 0.3; echo two; echo three >&2"}})
	require.NoError(t, err)
	defer p.CloseOutput(time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	line, err := p.WaitLine(ctx, func(l []byte) bool { return string(l) == "two" })
	require.NoError(t, err)
	assert.Equal(t, "two", string(line))
	_, err = p.WaitLine(ctx, func(l []byte) bool { return string(l) == "four" })
	assert.ErrorIs(t, err, ErrEnded)
	assert.Equal(t, "one\ntwo\nthree\n", p.Output(), "stdout and stderr in one")
	assert.NoError(t, p.ExitErr())
}

// A child that outlives the process holds the output; CloseOutput does not wait for it
// forever.
func TestCloseOutputWithAChildLeft(t *testing.T) {
	p, err := StartProcess(ProcessOptions{Path: "/bin/sh", Args: []string{"-c", "sleep 5 & echo started"}})
	require.NoError(t, err)
	<-p.Exited()
	start := time.Now()
	p.CloseOutput(100 * time.Millisecond)
	assert.Less(t, time.Since(start), 3*time.Second)
	assert.Equal(t, "started\n", p.Output())
}

func TestGone(t *testing.T) {
	assert.False(t, Gone(os.Getpid()))
	p, err := StartProcess(ProcessOptions{Path: "/bin/true"})
	require.NoError(t, err)
	<-p.Exited()
	p.CloseOutput(time.Second)
	assert.True(t, Gone(p.PID()))
}
