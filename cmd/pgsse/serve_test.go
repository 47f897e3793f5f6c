package main

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgsse/pgsse/engine"
	"github.com/pgsse/pgsse/internal/testkit/pgtest"
	"github.com/pgsse/pgsse/internal/testkit/servetest"
	"github.com/pgsse/pgsse/internal/testkit/ssetest"
)

// TestServeEndToEnd starts `pgsse serve`, checks the start-up log line and the admin
// endpoints, delivers one event published with `pgsse publish` to a client holding a
// token from `pgsse token`, then stops it with SIGTERM: the client sees retry: and EOF,
// the process exits 0.
func TestServeEndToEnd(t *testing.T) {
	dsn := pgtest.NewDatabase(t)
	requireOK(t, pgsse(t, nil, "migrate", "--database-url", dsn))
	secret := "0123456789abcdef0123456789abcdef"
	p := servetest.Start(t, servetest.Options{Bin: binary(t), Env: []string{"DATABASE_URL=" + dsn, "PGSSE_JWT_SECRET=" + secret},
		Args: []string{"--heartbeat", "1s"}, Wait: servetest.WaitServing})

	// The one start-up line names the bound addresses and the limits.
	var start struct {
		Msg            string `json:"msg"`
		Listen         string `json:"listen"`
		Admin          string `json:"admin"`
		MaxConnections int    `json:"max_connections"`
		MaxHeaderBytes int    `json:"max_header_bytes"`
		Heartbeat      string `json:"heartbeat"`
		JWT            string `json:"jwt"`
	}
	line := p.WaitLog(20*time.Second, "the start-up log line", func(l map[string]any) bool {
		// cmd/pgsse's line is the one that also names the admin address.
		_, admin := l["admin"]
		return l["msg"] == "pgsse serving" && admin
	})
	b, err := json.Marshal(line)
	require.NoError(t, err)
	require.NoError(t, json.Unmarshal(b, &start))
	assert.Equal(t, engine.MaxConnectionsFor(engine.FDLimit()), start.MaxConnections)
	assert.Equal(t, 8192, start.MaxHeaderBytes)
	assert.Equal(t, "HS256", start.JWT)
	assert.Equal(t, "1s", start.Heartbeat)
	assert.Equal(t, p.Listen, start.Listen)
	assert.Equal(t, p.Admin, start.Admin)

	get := func(path string) (int, string) {
		resp, err := http.Get("http://" + start.Admin + path)
		require.NoError(t, err)
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		return resp.StatusCode, string(b)
	}
	code, body := get("/healthz")
	assert.Equal(t, 200, code)
	assert.Equal(t, "ok\n", body)
	waitFor(t, 20*time.Second, "/readyz 200", func() bool { c, _ := get("/readyz"); return c == 200 })
	code, body = get("/metrics")
	assert.Equal(t, 200, code)
	assert.Contains(t, body, "pgsse_")
	assert.Contains(t, body, "go_goroutines")
	assert.Contains(t, body, "process_open_fds")
	code, _ = get("/debug/pprof/")
	assert.Equal(t, 404, code, "no --pprof")

	// A client with a minted token.
	r := pgsse(t, []string{"PGSSE_JWT_SECRET=" + secret}, "token", "--stream", "orders/*", "--ttl", "5m")
	requireOK(t, r)
	token := strings.TrimSpace(r.stdout)
	conn, err := net.DialTimeout("tcp", start.Listen, 5*time.Second)
	require.NoError(t, err)
	defer conn.Close()
	require.NoError(t, conn.SetDeadline(time.Now().Add(30*time.Second)))
	_, err = io.WriteString(conn, "GET /streams/orders/1 HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "+token+"\r\n\r\n")
	require.NoError(t, err)
	rd := bufio.NewReader(conn)
	resp, err := http.ReadResponse(rd, nil)
	require.NoError(t, err)
	require.Equal(t, 200, resp.StatusCode)
	events := &ssetest.Stream{R: rd, Eager: true} // the preamble's retry comes at once
	ev, err := events.Next(0)
	require.NoError(t, err)
	require.Equal(t, "2000", ev.Retry, "the preamble: retry: first")

	r = pgsse(t, []string{"DATABASE_URL=" + dsn}, "publish", "orders/1", "hello from the CLI", "--event", "note")
	requireOK(t, r)
	assert.Equal(t, "1\n", r.stdout)
	ev, err = events.NextEvent(0)
	require.NoError(t, err)
	assert.Equal(t, "1", ev.ID)
	assert.Equal(t, "note", ev.Type)
	assert.Equal(t, "hello from the CLI", ev.Data)

	// A request without a token is refused.
	noTok, err := net.DialTimeout("tcp", start.Listen, 5*time.Second)
	require.NoError(t, err)
	defer noTok.Close()
	require.NoError(t, noTok.SetDeadline(time.Now().Add(10*time.Second)))
	_, err = io.WriteString(noTok, "GET /streams/orders/1 HTTP/1.1\r\nHost: x\r\n\r\n")
	require.NoError(t, err)
	status, err := bufio.NewReader(noTok).ReadString('\n')
	require.NoError(t, err)
	assert.Equal(t, "HTTP/1.1 401 Unauthorized\r\n", status)

	// SIGTERM: the client gets a retry: and EOF, the process exits 0.
	p.Signal(syscall.SIGTERM)
	retried := false
	for {
		ev, err := events.Next(0)
		if err != nil {
			require.ErrorIs(t, err, io.EOF, "EOF, not a reset")
			break
		}
		retried = retried || ev.Retry != ""
	}
	assert.True(t, retried, "a retry: before the close")
	assert.Equal(t, 0, p.WaitExit(30*time.Second), "exit status; log:\n%s", p.Log())
	assert.NotContains(t, p.Log(), `"level":"ERROR"`)
	_, err = http.Get("http://" + start.Admin + "/healthz")
	assert.Error(t, err, "admin server closed")
}

// TestServeAdminListenBusy: a taken admin address ends the start with one line naming the
// flag (docs/operations.md, Configuration), as a taken --listen does; exit 1.
func TestServeAdminListenBusy(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, binary(t), "serve", "--listen", "127.0.0.1:0", "--admin-listen", ln.Addr().String(),
		"--jwt-secret", "0123456789abcdef0123456789abcdef", "--database-url", pgtest.NewDatabase(t))
	cmd.Env = cleanEnv()
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	require.ErrorAs(t, err, &ee)
	assert.Equal(t, 1, ee.ExitCode())
	line := strings.TrimSuffix(string(out), "\n")
	assert.NotContains(t, line, "\n", "one line")
	assert.Contains(t, line, "level=ERROR")
	assert.Contains(t, line, "pgsse cannot start")
	assert.Contains(t, line, "--admin-listen "+ln.Addr().String()+": admin server cannot listen: bind: address already in use")
}

// Issue 23: 64 idle connections to the admin port — ones that sent nothing, or one request each
// and then kept alive — held every slot of --admin-max-connections, and /healthz, /readyz and
// /metrics did not answer for 10 s or a minute. At the cap, a new connection now closes the one
// idle longest: a probe answers within a second, and the cap holds.
func TestAdminIdleConnectionsDoNotLockOut(t *testing.T) {
	dsn := pgtest.NewDatabase(t)
	requireOK(t, pgsse(t, nil, "migrate", "--database-url", dsn))
	p := startServe(t, 0, []string{"DATABASE_URL=" + dsn, "PGSSE_JWT_SECRET=0123456789abcdef0123456789abcdef"})
	const cap = engine.DefaultAdminMaxConnections
	probe := func(what string) {
		t.Helper()
		client := http.Client{Timeout: 15 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
		start := time.Now()
		resp, err := client.Get(p.AdminURL("/healthz"))
		require.NoError(t, err, "%s; log:\n%s", what, p.Log())
		resp.Body.Close()
		assert.Equal(t, 200, resp.StatusCode, what)
		assert.Less(t, time.Since(start), time.Second, "/healthz %s", what)
	}
	dialAll := func(request bool) []net.Conn {
		t.Helper()
		var conns []net.Conn
		for range cap {
			c, err := net.DialTimeout("tcp", p.Admin, 5*time.Second)
			require.NoError(t, err)
			t.Cleanup(func() { c.Close() })
			if request { // one request, answered, and the connection kept alive
				_, err = io.WriteString(c, "GET /healthz HTTP/1.1\r\nHost: admin\r\n\r\n")
				require.NoError(t, err)
				_ = c.SetReadDeadline(time.Now().Add(15 * time.Second))
				resp, err := http.ReadResponse(bufio.NewReader(c), nil)
				require.NoError(t, err)
				resp.Body.Close()
				require.Equal(t, 200, resp.StatusCode)
				_ = c.SetReadDeadline(time.Time{})
			}
			conns = append(conns, c)
		}
		return conns
	}

	silent := dialAll(false)
	probe("behind 64 connections that sent nothing")
	// The one idle longest made room: it is closed.
	_ = silent[0].SetReadDeadline(time.Now().Add(5 * time.Second))
	_, err := silent[0].Read(make([]byte, 1))
	assert.ErrorIs(t, err, io.EOF, "the idlest connection was closed")

	dialAll(true)
	probe("behind 64 kept-alive connections")
	p.Alive("at the end")
}
