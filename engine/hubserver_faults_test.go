package engine

import (
	"bufio"
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgsse/pgsse/auth"
	"github.com/pgsse/pgsse/framing"
	"github.com/pgsse/pgsse/internal/testkit/pgtest"
	"github.com/pgsse/pgsse/pglisten"
)

func authClaimsChannels(ch ...string) auth.Claims { return auth.Claims{Channels: ch} }

// TestHubListenerDown: the LISTEN backend terminated → every worker gets LISTENER_DOWN, then
// RESYNC (all channels) once the session is back, then notifications again.
func TestHubListenerDown(t *testing.T) {
	bin := buildWorker(t)
	ts := startHub(t, nil)
	workers := []*workerProc{
		startWorker(t, bin, "a", ts.cfg.HubSocket, ts.DSN, "lossless", "fault_a"),
		startWorker(t, bin, "b", ts.cfg.HubSocket, ts.DSN, "wake", "fault_b"),
	}
	for _, w := range workers {
		require.Equal(t, "hub", w.expectEv(15*time.Second, "ready").Source)
	}
	pgtest.Exec(t, ts.DSN, "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = 'pgsse-listen' AND datname = current_database()")
	for _, w := range workers {
		l := w.nextLine(15 * time.Second)
		assert.Equal(t, "down", l.Ev, "worker %s: LISTENER_DOWN first (%+v)", w.name, l)
		l = w.nextLine(20 * time.Second)
		assert.Equal(t, hubLine{Ev: "resync", Source: "hub"}, l, "worker %s: then RESYNC for all channels", w.name)
	}
	pub := connect(t, ts.DSN)
	pgNotify(t, pub, "fault_a", []byte("back a"))
	pgNotify(t, pub, "fault_b", []byte("back b"))
	for i, w := range workers {
		l := w.nextLine(10 * time.Second)
		assert.Equal(t, "notify", l.Ev)
		assert.Equal(t, "back "+string(rune('a'+i)), string(l.Payload))
		assert.Equal(t, "hub", l.Source)
	}
	assert.Equal(t, 1, listenBackends(t, ts.DSN))
}

// TestHubHelperServer is not a test: TestHubServerKilled runs the test binary with
// PGSSE_HUB_HELPER set to serve a hub in a separate process that it can SIGKILL.
func TestHubHelperServer(t *testing.T) {
	dsn, sock := os.Getenv("PGSSE_HUB_HELPER_DSN"), os.Getenv("PGSSE_HUB_HELPER_SOCKET")
	if dsn == "" {
		return
	}
	srv, err := New(Config{DatabaseURL: dsn, Listen: "127.0.0.1:0", HubSocket: sock, Retention: 0,
		Logger: slog.New(slog.NewTextHandler(os.Stderr, nil))})
	require.NoError(t, err)
	go func() { _ = srv.Run(context.Background()) }()
	<-srv.Started()
	for !srv.lsn.ok() {
		time.Sleep(5 * time.Millisecond)
	}
	fmt.Println("HELPER READY")
	select {} // until SIGKILL
}

// TestHubServerKilled: pgsse SIGKILLed → every worker fails over to its own session (down,
// then resync), the next NOTIFY reaches all of them, and the census becomes one LISTEN
// backend per worker.
func TestHubServerKilled(t *testing.T) {
	bin := buildWorker(t)
	dsn := migratedDB(t)
	sock := hubSocketPath(t)
	helper := exec.Command(os.Args[0], "-test.run=^TestHubHelperServer$", "-test.count=1")
	helper.Env = append(os.Environ(), "PGSSE_HUB_HELPER_DSN="+dsn, "PGSSE_HUB_HELPER_SOCKET="+sock)
	out, err := helper.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, helper.Start())
	var killed atomic.Bool
	t.Cleanup(func() {
		if !killed.Load() {
			_ = helper.Process.Kill()
		}
		_ = helper.Wait()
	})
	ready := make(chan bool, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if strings.Contains(sc.Text(), "HELPER READY") {
				ready <- true
			}
		}
		close(ready)
	}()
	select {
	case ok := <-ready:
		require.True(t, ok, "helper server exited before it was ready")
	case <-time.After(30 * time.Second):
		t.Fatal("helper server not ready within 30s")
	}

	const n = 4
	workers := make([]*workerProc, n)
	for i := range workers {
		workers[i] = startWorker(t, bin, fmt.Sprintf("k%d", i), sock, dsn, "lossless", fmt.Sprintf("kill_%d", i), "kill_all")
	}
	for _, w := range workers {
		require.Equal(t, "hub", w.expectEv(15*time.Second, "ready").Source)
	}
	assert.Equal(t, 1, listenBackends(t, dsn))

	require.NoError(t, helper.Process.Signal(syscall.SIGKILL))
	killed.Store(true)
	for _, w := range workers {
		m := w.expectEv(20*time.Second, "source")
		assert.Equal(t, "direct", m.Source)
		assert.Contains(t, m.Err, "closed the connection")
		d := w.nextLine(20 * time.Second)
		assert.Equal(t, hubLine{Ev: "down", Source: "direct"}, d, "worker %s: the switch is a loss", w.name)
		r := w.nextLine(20 * time.Second)
		assert.Equal(t, hubLine{Ev: "resync", Source: "direct"}, r, "worker %s: resync after the switch", w.name)
	}
	pub := connect(t, dsn)
	pgNotify(t, pub, "kill_all", []byte("after the kill"))
	for i := range workers {
		pgNotify(t, pub, fmt.Sprintf("kill_%d", i), []byte(fmt.Sprint("own ", i)))
	}
	for i, w := range workers {
		l := w.expectEv(10*time.Second, "notify")
		assert.Equal(t, "after the kill", string(l.Payload), "worker %d", i)
		l = w.expectEv(10*time.Second, "notify")
		assert.Equal(t, fmt.Sprint("own ", i), string(l.Payload), "worker %d", i)
		assert.Equal(t, "direct", l.Source)
	}
	waitFor(t, 15*time.Second, "one LISTEN backend per worker", func() bool { return listenBackends(t, dsn) == n })
}

// TestHubShutdown: a graceful stop sends SHUTDOWN; the failover Listener switches (KindDown,
// then KindResync once its own session LISTENs).
func TestHubShutdown(t *testing.T) {
	ts := startHub(t, nil)
	l, err := pglisten.NewFailover(pglisten.FailoverConfig{
		Hub:    pglisten.HubConfig{Socket: ts.cfg.HubSocket, PingInterval: -1},
		Direct: pglisten.Config{DSN: ts.DSN},
	})
	require.NoError(t, err)
	defer l.Close()
	f := l.(*pglisten.Failover)
	require.NoError(t, l.Listen(context.Background(), "bye"))
	require.Equal(t, pglisten.SourceHub, f.Source())
	raw := dialHub(t, ts.cfg.HubSocket)
	raw.hello("raw")

	ts.Stop(t)
	frames, err := raw.untilClosed(10 * time.Second)
	require.NoError(t, err)
	require.NotEmpty(t, frames)
	assert.Equal(t, framing.StatusShutdown, frames[len(frames)-1].Status)
	for _, want := range []pglisten.EventKind{pglisten.KindDown, pglisten.KindResync} {
		select {
		case ev := <-l.Events():
			assert.Equal(t, pglisten.Event{Kind: want}, ev, "a switch is a loss: down, then resync")
		case <-time.After(20 * time.Second):
			t.Fatalf("no %s after SHUTDOWN", want)
		}
	}
	assert.Equal(t, pglisten.SourceDirect, f.Source())
	assert.ErrorIs(t, f.Reason(), pglisten.ErrHubShutdown)
	_, err = os.Lstat(ts.cfg.HubSocket)
	assert.ErrorIs(t, err, os.ErrNotExist, "the socket is removed on exit")
}

// TestHubSocketFile: the socket never exists with a looser mode than configured, a second
// server refuses a path that is served, a stale file is replaced, and anything that is not a
// socket is left alone.
func TestHubSocketFile(t *testing.T) {
	dsn := migratedDB(t)
	for _, mode := range []os.FileMode{0o600, 0o660} {
		t.Run(mode.String(), func(t *testing.T) {
			sock := hubSocketPath(t)
			var seen, loose atomic.Int64
			var badMode atomic.Uint32
			stop := make(chan struct{})
			done := make(chan struct{})
			go func() {
				defer close(done)
				for {
					select {
					case <-stop:
						return
					default:
					}
					if fi, err := os.Lstat(sock); err == nil {
						seen.Add(1)
						if fi.Mode().Perm()&^mode != 0 {
							loose.Add(1)
							badMode.Store(uint32(fi.Mode().Perm()))
						}
					}
				}
			}()
			ts := startServer(t, dsn, func(c *Config) { c.HubSocket = sock; c.HubSocketMode = mode })
			close(stop)
			<-done
			require.Positive(t, seen.Load(), "the watcher saw the socket")
			assert.Zero(t, loose.Load(), "socket seen with mode %o", badMode.Load())
			fi, err := os.Lstat(sock)
			require.NoError(t, err)
			assert.Equal(t, mode, fi.Mode().Perm())
			assert.Equal(t, os.ModeSocket, fi.Mode().Type())

			// A second server on the same path refuses to start; the first keeps serving.
			second, err := New(Config{DatabaseURL: dsn, Listen: "127.0.0.1:0", HubSocket: sock, Logger: ts.log})
			require.NoError(t, err)
			err = second.Run(context.Background())
			require.Error(t, err)
			assert.Equal(t, "--hub-socket "+sock+": another process is serving it", err.Error())
			w := dialHub(t, sock)
			w.hello("still there")
			ts.Stop(t)
		})
	}

	t.Run("stale file replaced", func(t *testing.T) {
		sock := hubSocketPath(t)
		ln, err := net.Listen("unix", sock)
		require.NoError(t, err)
		ln.(*net.UnixListener).SetUnlinkOnClose(false)
		require.NoError(t, ln.Close())
		_, err = os.Lstat(sock)
		require.NoError(t, err, "stale socket file left behind")
		ts := startServer(t, dsn, func(c *Config) { c.HubSocket = sock })
		w := dialHub(t, sock)
		w.hello("after stale")
		ts.Stop(t)
		_, err = os.Lstat(sock)
		assert.ErrorIs(t, err, os.ErrNotExist, "removed on exit")
	})

	t.Run("not a socket", func(t *testing.T) {
		path := hubSocketPath(t)
		require.NoError(t, os.WriteFile(path, []byte("keep me"), 0o600))
		srv, err := New(Config{DatabaseURL: dsn, Listen: "127.0.0.1:0", HubSocket: path})
		require.NoError(t, err)
		err = srv.Run(context.Background())
		require.Error(t, err)
		assert.Contains(t, err.Error(), "--hub-socket "+path+": exists and is not a socket")
		b, err := os.ReadFile(path)
		require.NoError(t, err)
		assert.Equal(t, "keep me", string(b))
	})
}
