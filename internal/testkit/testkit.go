package testkit

import (
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"
)

// WaitFor polls cond until it holds and fails the test (naming what) once timeout has
// passed. It is for conditions that have no signal to wait on — a value in another
// process, a row in PostgreSQL, a counter — never a substitute for one that has.
func WaitFor(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	pause := time.Millisecond
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(pause) // polling: cond has no signal (see above)
		pause = min(2*pause, 20*time.Millisecond)
	}
}

// FreePort returns a TCP port on 127.0.0.1 that was free a moment ago, for a program the
// test starts (pgsse, nginx, Caddy) to bind. It is taken below Linux's ephemeral range
// (32768–60999), so that the outgoing connections of everything else running cannot occupy
// it between this check and the bind (or between a server's stop and its restart on the same
// port), and it is never handed out twice in one test process. Another test process may
// still take it first: whoever binds should retry on new ports when the bind fails.
func FreePort(t testing.TB) int {
	t.Helper()
	portsMu.Lock()
	defer portsMu.Unlock()
	for range 1000 {
		port := 20000 + rand.IntN(12000)
		if portsGiven[port] {
			continue
		}
		l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port))
		if err != nil {
			continue
		}
		l.Close()
		portsGiven[port] = true
		return port
	}
	t.Fatal("no free port in 20000-31999")
	return 0
}

var (
	portsMu    sync.Mutex
	portsGiven = map[int]bool{}
)

// SocketPath is a fresh path for a Unix socket, short enough for sun_path (108 bytes) even
// when the test's temporary directory is long; removed when the test ends.
func SocketPath(t testing.TB, name string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if len(p) < 100 {
		return p
	}
	dir, err := os.MkdirTemp("", "sock")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return filepath.Join(dir, name)
}

// Tail returns at most the last n bytes of s, for failure messages.
func Tail(s string, n int) string {
	if len(s) > n {
		return "…" + s[len(s)-n:]
	}
	return s
}
