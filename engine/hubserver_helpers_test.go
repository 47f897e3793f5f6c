package engine

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/pgsse/pgsse/framing"
	"github.com/pgsse/pgsse/internal/testkit"
	"github.com/pgsse/pgsse/internal/testkit/metricstest"
	"github.com/pgsse/pgsse/internal/testkit/pgtest"
)

// hubSocketPath is a fresh socket path short enough for sun_path (107 bytes).
func hubSocketPath(t testing.TB) string {
	t.Helper()
	return testkit.SocketPath(t, "hub.sock")
}

// startHub runs a server with a hub socket.
func startHub(t testing.TB, tweak func(*Config)) *testServer {
	t.Helper()
	sock := hubSocketPath(t)
	return startServer(t, "", func(c *Config) {
		c.HubSocket = sock
		if tweak != nil {
			tweak(c)
		}
	})
}

func pgNotify(t testing.TB, conn *pgconn.PgConn, ch string, payload []byte) {
	t.Helper()
	res := conn.ExecParams(context.Background(), "SELECT pg_notify($1, $2)", [][]byte{[]byte(ch), payload}, nil, nil, nil).Read()
	require.NoError(t, res.Err)
}

// listenBackends counts LISTEN sessions (application_name pgsse-listen) on dsn's database.
func listenBackends(t testing.TB, dsn string) int {
	t.Helper()
	v := pgtest.QueryValue(t, dsn, "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'pgsse-listen' AND datname = current_database()")
	n, err := strconv.Atoi(v)
	require.NoError(t, err)
	return n
}

// --- a raw worker speaking frames on the socket -------------------------------------------

type rawWorker struct {
	t    testing.TB
	conn net.Conn
	dec  framing.Decoder
	buf  []byte
}

func dialHub(t testing.TB, sock string) *rawWorker {
	t.Helper()
	c, err := net.DialTimeout("unix", sock, 5*time.Second)
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	return &rawWorker{t: t, conn: c, buf: make([]byte, 64<<10)}
}

// hello says HELLO and expects READY.
func (r *rawWorker) hello(name string) {
	r.t.Helper()
	r.send(framing.AppendHello(nil, uint32(os.Getpid()), []byte(name)))
	f := r.next(5 * time.Second)
	require.Equal(r.t, framing.TypeStatus, f.Type)
	require.Equal(r.t, framing.StatusReady, f.Status)
}

func (r *rawWorker) send(b []byte) {
	r.t.Helper()
	_ = r.conn.SetWriteDeadline(time.Now().Add(5 * time.Second))
	_, err := r.conn.Write(b)
	require.NoError(r.t, err)
}

// read returns the next frame (views copied) or an error (EOF, timeout, protocol).
func (r *rawWorker) read(timeout time.Duration) (framing.Frame, error) {
	_ = r.conn.SetReadDeadline(time.Now().Add(timeout))
	defer r.conn.SetReadDeadline(time.Time{})
	for {
		f, err := r.dec.Next()
		if err == nil {
			f.Channel = bytes.Clone(f.Channel)
			f.Name = bytes.Clone(f.Name)
			f.Text = bytes.Clone(f.Text)
			return f, nil
		}
		if err != framing.ErrIncomplete {
			return f, err
		}
		n, err := r.conn.Read(r.buf)
		if n > 0 {
			r.dec.Feed(r.buf[:n])
			continue
		}
		if err != nil {
			return framing.Frame{}, err
		}
	}
}

func (r *rawWorker) next(timeout time.Duration) framing.Frame {
	r.t.Helper()
	f, err := r.read(timeout)
	require.NoError(r.t, err)
	return f
}

func (r *rawWorker) sub(req uint32, mode framing.Mode, ch string) framing.Frame {
	r.t.Helper()
	r.send(framing.AppendSub(nil, req, mode, []byte(ch)))
	f := r.next(10 * time.Second)
	require.Equal(r.t, framing.TypeAck, f.Type, "answer to SUB")
	require.Equal(r.t, req, f.Req)
	return f
}

// untilClosed reads frames until EOF (or error) and returns them.
func (r *rawWorker) untilClosed(timeout time.Duration) ([]framing.Frame, error) {
	var out []framing.Frame
	deadline := time.Now().Add(timeout)
	for {
		f, err := r.read(time.Until(deadline))
		if err != nil {
			if errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET) {
				return out, nil
			}
			return out, err
		}
		out = append(out, f)
	}
}

// --- worker processes (testdata/hubworker) -------------------------------------------------

// hubLine is one line the worker process prints.
type hubLine struct {
	Ev      string `json:"ev"`
	Ch      string `json:"ch"`
	PID     uint32 `json:"pid"`
	Payload []byte `json:"payload"`
	Source  string `json:"source"` // hub or direct
	Err     string `json:"err"`
}

// buildWorker builds testdata/hubworker into the test's temporary directory (the build cache
// makes every build after the first cheap).
func buildWorker(t testing.TB) string {
	t.Helper()
	dir := t.TempDir()
	bin := filepath.Join(dir, "hubworker")
	out, err := exec.Command("go", "build", "-o", bin, "./testdata/hubworker").CombinedOutput()
	require.NoError(t, err, "go build ./testdata/hubworker: %s", out)
	return bin
}

type workerProc struct {
	t     testing.TB
	name  string
	cmd   *exec.Cmd
	stdin io.WriteCloser
	lines chan hubLine
}

// startWorker runs the worker binary; it is killed at the end of the test.
func startWorker(t testing.TB, bin, name, sock, dsn, mode string, channels ...string) *workerProc {
	t.Helper()
	chs := ""
	for i, c := range channels {
		if i > 0 {
			chs += ","
		}
		chs += c
	}
	cmd := exec.Command(bin, "-socket", sock, "-dsn", dsn, "-mode", mode, "-name", name, "-channels", chs)
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	stdin, err := cmd.StdinPipe()
	require.NoError(t, err)
	stderr := &testkit.SyncBuffer{}
	cmd.Stderr = stderr
	require.NoError(t, cmd.Start())
	p := &workerProc{t: t, name: name, cmd: cmd, stdin: stdin, lines: make(chan hubLine, 100000)}
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer close(p.lines)
		sc := bufio.NewScanner(stdout)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			var l hubLine
			if json.Unmarshal(sc.Bytes(), &l) == nil {
				p.lines <- l
			}
		}
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGCONT)
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		<-done
		if t.Failed() {
			t.Logf("worker %s stderr:\n%s", name, stderr.String())
		}
	})
	return p
}

// expect returns the next line matching ok, failing after timeout; lines before it are dropped.
func (p *workerProc) expect(timeout time.Duration, what string, ok func(hubLine) bool) hubLine {
	p.t.Helper()
	deadline := time.After(timeout)
	for {
		select {
		case l, open := <-p.lines:
			if !open {
				p.t.Fatalf("worker %s exited while waiting for %s", p.name, what)
			}
			if ok(l) {
				return l
			}
		case <-deadline:
			p.t.Fatalf("worker %s: no %s within %v", p.name, what, timeout)
		}
	}
}

func (p *workerProc) expectEv(timeout time.Duration, ev string) hubLine {
	p.t.Helper()
	return p.expect(timeout, ev, func(l hubLine) bool { return l.Ev == ev })
}

// nextLine returns the next line of any kind.
func (p *workerProc) nextLine(timeout time.Duration) hubLine {
	p.t.Helper()
	return p.expect(timeout, "a line", func(hubLine) bool { return true })
}

func (p *workerProc) command(s string) {
	p.t.Helper()
	_, err := io.WriteString(p.stdin, s+"\n")
	require.NoError(p.t, err)
}

func (p *workerProc) signal(sig syscall.Signal) {
	p.t.Helper()
	require.NoError(p.t, p.cmd.Process.Signal(sig))
}

// metricValue reads a counter or gauge (safe from any goroutine); any other kind fails the
// test (internal/testkit/metricstest).
var metricValue = metricstest.Value
