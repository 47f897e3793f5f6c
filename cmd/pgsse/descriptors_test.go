package main

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/pgsse/pgsse/internal/testkit/pgtest"
	"github.com/pgsse/pgsse/internal/testkit/servetest"
	"github.com/pgsse/pgsse/internal/testkit/ssetest"
)

// startServe runs `pgsse serve` (internal/testkit/servetest) with RLIMIT_NOFILE nofile (0 = the
// test's own limit), env and args, and waits for "pgsse serving" (not /readyz: some tests
// start it against a database that is not there).
func startServe(t *testing.T, nofile int, env []string, args ...string) *servetest.Server {
	t.Helper()
	return servetest.Start(t, servetest.Options{Bin: binary(t), NoFile: nofile, Env: env, Args: args, Wait: servetest.WaitServing})
}

// openFDs counts a process's open descriptors.
func openFDs(t *testing.T, pid int) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/" + itoa(pid) + "/fd")
	require.NoError(t, err)
	return len(ents)
}

// lowestFreeFD is the descriptor number a process's next open would get: with the soft
// limit set to it, the next accept fails with EMFILE.
func lowestFreeFD(t *testing.T, pid int) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/" + itoa(pid) + "/fd")
	require.NoError(t, err)
	used := map[int]bool{}
	for _, e := range ents {
		n, err := strconv.Atoi(e.Name())
		require.NoError(t, err)
		used[n] = true
	}
	n := 0
	for used[n] {
		n++
	}
	return n
}

func itoa(n int) string { return strconv.Itoa(n) }

// subscriber is an SSE client past its response head.
type subscriber struct {
	conn   net.Conn
	stream *ssetest.Stream
}

// subscribe opens an SSE subscription and reads the response head.
func subscribe(t *testing.T, addr, path, token string) *subscriber {
	t.Helper()
	conn, err := net.DialTimeout("tcp", addr, 10*time.Second)
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close() })
	require.NoError(t, conn.SetDeadline(time.Now().Add(30*time.Second)))
	_, err = io.WriteString(conn, "GET "+path+" HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "+token+"\r\n\r\n")
	require.NoError(t, err)
	rd := bufio.NewReader(conn)
	resp, err := http.ReadResponse(rd, nil)
	require.NoError(t, err)
	require.Equal(t, 200, resp.StatusCode)
	require.NoError(t, conn.SetDeadline(time.Time{}))
	return &subscriber{conn, &ssetest.Stream{R: rd, Conn: conn}}
}

// readUntilData reads SSE events until one whose data is want.
func (s *subscriber) readUntilData(t *testing.T, want string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		ev, err := s.stream.NextEvent(time.Until(deadline))
		require.NoError(t, err, "waiting for data %q", want)
		if ev.Data == want {
			return
		}
	}
}

// flood opens n connections to network/addr and keeps them open (sending nothing) until the
// returned function closes them; connections the server refuses or closes are fine.
func flood(network, addr string, n int) (opened int, closeAll func()) {
	var conns []net.Conn
	for i := 0; i < n; i++ {
		c, err := net.DialTimeout(network, addr, 2*time.Second)
		if err != nil {
			continue
		}
		conns = append(conns, c)
	}
	return len(conns), func() {
		for _, c := range conns {
			c.Close()
		}
	}
}

// docs/operations.md, Many connections (issue 11): pgsse started with a low RLIMIT_NOFILE
// survives being driven past it through the admin port, the hub and the SSE port — an
// already-connected subscriber keeps receiving, new subscribers are accepted once descriptors
// free up, the process never exits, and pgsse_accept_errors_total counts what accept refused. On
// gnet's own acceptor the first EMFILE stopped the loop and the process exited.
func TestServeSurvivesDescriptorExhaustion(t *testing.T) {
	const nofile = 1024
	dsn := pgtest.NewDatabase(t)
	requireOK(t, pgsse(t, nil, "migrate", "--database-url", dsn))
	secret := "0123456789abcdef0123456789abcdef"
	hubPath := filepath.Join(t.TempDir(), "hub.sock")
	p := startServe(t, nofile, []string{"DATABASE_URL=" + dsn, "PGSSE_JWT_SECRET=" + secret,
		"PGSSE_MAX_CONNECTIONS_PER_SUBJECT=0"}, "--hub-socket", hubPath)
	r := pgsse(t, []string{"PGSSE_JWT_SECRET=" + secret}, "token", "--stream", "*", "--ttl", "10m")
	requireOK(t, r)
	token := strings.TrimSpace(r.stdout)
	publish := func(data string) {
		t.Helper()
		requireOK(t, pgsse(t, []string{"DATABASE_URL=" + dsn}, "publish", "fd", data))
	}
	first := subscribe(t, p.Listen, "/streams/fd", token)

	// 1. Floods on every port, each larger than the whole limit: the caps hold them (the admin
	// port stops accepting at --admin-max-connections, the hub and SSE ports close what is
	// over their caps at once).
	_, closeAdmin := flood("tcp", p.Admin, 2*nofile)
	defer closeAdmin()
	_, closeHub := flood("unix", hubPath, nofile)
	defer closeHub()
	_, closeSSE := flood("tcp", p.Listen, 2*nofile)
	defer closeSSE()
	p.Alive("under the floods")
	assert.LessOrEqual(t, openFDs(t, p.PID()), nofile)
	publish("during the floods")
	first.readUntilData(t, "during the floods")

	// 2. Descriptors really run out: the soft limit drops to the next free descriptor number
	// (as when something else in the process took the rest), and more clients arrive on the
	// SSE port and the hub.
	// A descriptor the server held only briefly at the moment of measuring (a connection of
	// the floods above still being closed, the periodic schema check) frees a slot below
	// the new limit, and accept may then never fail; so while no EMFILE has been seen, the
	// limit is lowered to the lowest free descriptor again and more clients arrive.
	pid := p.PID()
	var lim unix.Rlimit
	require.NoError(t, unix.Prlimit(pid, unix.RLIMIT_NOFILE, nil, &lim))
	var closers []func()
	defer func() {
		for _, c := range closers {
			c()
		}
	}()
	exhaust := func() {
		low := unix.Rlimit{Cur: uint64(lowestFreeFD(t, pid)), Max: lim.Max}
		require.NoError(t, unix.Prlimit(pid, unix.RLIMIT_NOFILE, &low, nil))
		_, closeSSE2 := flood("tcp", p.Listen, 200)
		_, closeHub2 := flood("unix", hubPath, 50)
		closers = append(closers, closeSSE2, closeHub2)
	}
	exhaust()
	lastTry := time.Now()
	waitFor(t, 30*time.Second, "an accept to fail with EMFILE", func() bool {
		if strings.Contains(p.Log(), "out of file descriptors") {
			return true
		}
		if time.Since(lastTry) > 3*time.Second {
			exhaust()
			lastTry = time.Now()
		}
		return false
	})
	p.Alive("out of descriptors")
	publish("while out of descriptors")
	first.readUntilData(t, "while out of descriptors")

	// 3. Descriptors free up: the limit is back and the floods are gone. New subscribers are
	// accepted, and the counts are there.
	require.NoError(t, unix.Prlimit(pid, unix.RLIMIT_NOFILE, &lim, nil))
	closeSSE()
	for _, c := range closers {
		c()
	}
	closers = nil
	closeHub()
	closeAdmin()
	waitFor(t, 30*time.Second, "a new subscriber to be accepted", func() bool {
		conn, err := net.DialTimeout("tcp", p.Listen, 2*time.Second)
		if err != nil {
			return false
		}
		conn.Close()
		return true
	})
	second := subscribe(t, p.Listen, "/streams/fd", token)
	publish("after")
	first.readUntilData(t, "after")
	second.readUntilData(t, "after")
	waitFor(t, 30*time.Second, "the admin port to answer again", func() bool {
		client := http.Client{Timeout: 2 * time.Second}
		resp, err := client.Get(p.AdminURL("/healthz"))
		if err != nil {
			return false
		}
		resp.Body.Close()
		return true
	})
	emfile := p.Metric(`pgsse_accept_errors_total{reason="emfile"}`)
	assert.Positive(t, emfile, "accept errors are counted")
	p.Alive("at the end")
	t.Logf("emfile %v; log:\n%s", emfile, p.Log())
	logged := strings.Count(p.Log(), "out of file descriptors")
	assert.LessOrEqual(t, logged, 4, "at most one line per 10 s per listener:\n%s", p.Log())
}
