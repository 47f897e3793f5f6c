package e2e

import (
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"text/template"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgsse/pgsse/internal/testkit"
	"github.com/pgsse/pgsse/internal/testkit/servetest"
)

// nginxProxy is nginx in the foreground, proxying to a pgsse server.
type nginxProxy struct {
	port int
}

func (n *nginxProxy) URL(path string) string {
	return "http://127.0.0.1:" + strconv.Itoa(n.port) + path
}

// startNginx renders e2e/nginx/nginx.conf.tmpl for upstream s into a temporary prefix and
// runs nginx there until the test ends.
func startNginx(t *testing.T, s *servetest.Server) *nginxProxy {
	t.Helper()
	n := &nginxProxy{port: freePort(t)}
	runNginx(t, "nginx.conf.tmpl", map[string]any{"Port": n.port, "Upstream": "127.0.0.1:" + strconv.Itoa(s.Port())}, n.port)
	return n
}

// runNginx renders e2e/nginx/TMPL with data (plus .Prefix, a temporary directory) and runs
// nginx in the foreground with it until the test ends; it returns once nginx accepts
// connections on port.
func runNginx(t *testing.T, tmplName string, data map[string]any, port int) {
	t.Helper()
	prefix := t.TempDir()
	data["Prefix"] = prefix
	tmpl, err := template.ParseFiles(filepath.Join(repoRoot, "e2e", "nginx", tmplName))
	require.NoError(t, err)
	conf := filepath.Join(prefix, "nginx.conf")
	f, err := os.Create(conf)
	require.NoError(t, err)
	require.NoError(t, tmpl.Execute(f, data))
	require.NoError(t, f.Close())

	bin, err := exec.LookPath("nginx")
	if err != nil {
		bin = "/usr/sbin/nginx"
	}
	runProxy(t, exec.Command(bin, "-p", prefix, "-e", filepath.Join(prefix, "error.log"), "-c", conf), port, func() string {
		log, _ := os.ReadFile(filepath.Join(prefix, "error.log"))
		access, _ := os.ReadFile(filepath.Join(prefix, "access.log"))
		return "error.log:\n" + tail(string(log), 4000) + "\naccess.log:\n" + tail(string(access), 4000)
	})
}

// runProxy runs a reverse proxy (nginx, Caddy) in the foreground until the test ends (SIGINT,
// then SIGKILL after 10 s) and returns once it accepts connections on 127.0.0.1:port. When the
// test fails it logs the proxy's output and what logs() returns.
func runProxy(t *testing.T, cmd *exec.Cmd, port int, logs func() string) {
	t.Helper()
	name := filepath.Base(cmd.Path)
	out := &testkit.SyncBuffer{}
	cmd.Stdout, cmd.Stderr = out, out
	require.NoError(t, cmd.Start())
	exited := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(exited)
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(os.Interrupt) // SIGINT: fast shutdown
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
		if t.Failed() {
			t.Logf("%s output:\n%s\n%s", name, tail(out.String(), 4000), logs())
		}
	})
	deadline := time.Now().Add(20 * time.Second)
	for {
		select {
		case <-exited:
			t.Fatalf("%s exited at start:\n%s\n%s", name, out.String(), logs())
		default:
		}
		c, err := net.DialTimeout("tcp", "127.0.0.1:"+strconv.Itoa(port), time.Second)
		if err == nil {
			c.Close()
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s not accepting after 20 s: %v", name, err)
		}
		time.Sleep(50 * time.Millisecond) // polling: the proxy has no readiness signal
	}
}

// Through nginx with default buffering, each event arrives within 500 ms of its commit,
// because pgsse sends X-Accel-Buffering: no. The control location, told to ignore that
// header, holds the same events back.
func TestNginx_EventsArriveWithoutDelay(t *testing.T) {
	dsn := newDatabase(t)
	s := startServer(t, dsn, "127.0.0.1")
	n := startNginx(t, s)
	token := mintToken(t, "ticks")

	resp, items := openStream(t, n.URL("/streams/ticks"), http.Header{"Authorization": {"Bearer " + token}})
	require.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Equal(t, "text/event-stream; charset=utf-8", resp.Header.Get("Content-Type"))
	nextItem(t, items, 5*time.Second, "the retry: line through nginx", func(it sseItem) bool { return it.Kind == "retry" })

	// Control, on a raw connection (net/http would block until the response head
	// arrives, which here it does not): the same request through the location that
	// ignores X-Accel-Buffering.
	control, err := net.Dial("tcp", "127.0.0.1:"+strconv.Itoa(n.port))
	require.NoError(t, err)
	defer control.Close()
	_, err = control.Write([]byte("GET /ignore-accel/streams/ticks HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer " + token + "\r\n\r\n"))
	require.NoError(t, err)

	var worst time.Duration
	for i := 1; i <= 5; i++ {
		// Measured from before the publishing session connects: an upper bound on the
		// commit-to-client latency.
		before := time.Now()
		publishSQL(t, dsn, "ticks", "tick "+strconv.Itoa(i))
		ev := nextItem(t, items, 2*time.Second, "event "+strconv.Itoa(i), isEvent(strconv.Itoa(i)))
		lag := ev.At.Sub(before)
		assert.Equal(t, "tick "+strconv.Itoa(i), ev.Data)
		assert.Less(t, lag, 500*time.Millisecond, "event %d arrived %s after its publish began", i, lag)
		worst = max(worst, lag)
	}
	t.Logf("worst publish-to-client latency through nginx (publish call included): %s", worst)

	// Control: with X-Accel-Buffering ignored, nginx buffers, and the same five events
	// (nor even the response head) do not get through within a second.
	require.NoError(t, control.SetReadDeadline(time.Now().Add(time.Second)))
	buf := make([]byte, 4096)
	k, err := control.Read(buf)
	assert.Error(t, err, "control location passed %q through at once: the test cannot tell whether X-Accel-Buffering matters", buf[:k])
}

// With --heartbeat 2s, comment lines keep an idle stream alive through nginx past
// proxy_read_timeout 5s; without them (control: --heartbeat 15s), nginx cuts it at 5 s.
func TestNginx_HeartbeatsKeepConnectionPastProxyReadTimeout(t *testing.T) {
	dsn := newDatabase(t)
	s := startServer(t, dsn, "127.0.0.1", "--heartbeat", "2s")
	n := startNginx(t, s)
	quiet := startServer(t, dsn, "127.0.0.1", "--heartbeat", "15s")
	nq := startNginx(t, quiet)
	token := mintToken(t, "idle")
	auth := http.Header{"Authorization": {"Bearer " + token}}

	_, items := openStream(t, n.URL("/streams/idle"), auth)
	_, quietItems := openStream(t, nq.URL("/streams/idle"), auth)
	start := time.Now()
	nextItem(t, items, 5*time.Second, "the retry: line", func(it sseItem) bool { return it.Kind == "retry" })
	nextItem(t, quietItems, 5*time.Second, "the control's retry: line", func(it sseItem) bool { return it.Kind == "retry" })

	// Hold the connection for 8 s, counting heartbeats; it must not end.
	heartbeats := 0
	hold := time.NewTimer(time.Until(start.Add(8 * time.Second)))
	defer hold.Stop()
holding:
	for {
		select {
		case it := <-items:
			switch it.Kind {
			case "comment":
				heartbeats++
			case "eof":
				t.Fatalf("nginx closed the stream after %s (%v) despite heartbeats", it.At.Sub(start), it.Err)
			default:
				t.Fatalf("unexpected %+v on an idle stream", it)
			}
		case <-hold.C:
			break holding
		}
	}
	assert.GreaterOrEqual(t, heartbeats, 3, "a comment every 2 s over 8 s")

	publishSQL(t, dsn, "idle", "still here")
	ev := nextItem(t, items, 2*time.Second, "the event after 8 s idle", isEvent("1"))
	assert.Equal(t, "still here", ev.Data)

	// Control: the same proxy without heartbeats within 5 s ended the stream.
	end := nextItem(t, quietItems, 2*time.Second, "the control stream's end", func(it sseItem) bool { return it.Kind == "eof" })
	assert.Less(t, end.At.Sub(start), 7*time.Second, "proxy_read_timeout 5s cut the quiet stream")
}
