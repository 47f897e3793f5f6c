//go:build linux

package engine

import (
	"context"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/pgsse/pgsse/auth"
)

// hostTCPPages is the host's TCP memory in pages: /proc/net/sockstat's "TCP: … mem N" (every
// TCP socket of the host, not only this process's: other work on the machine shows in it).
func hostTCPPages(t testing.TB) int {
	t.Helper()
	b, err := os.ReadFile("/proc/net/sockstat")
	require.NoError(t, err)
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) == 0 || f[0] != "TCP:" {
			continue
		}
		for i := 1; i+1 < len(f); i++ {
			if f[i] == "mem" {
				n, err := strconv.Atoi(f[i+1])
				require.NoError(t, err)
				return n
			}
		}
	}
	t.Fatal("/proc/net/sockstat has no TCP mem")
	return 0
}

// Indexes into SO_MEMINFO's answer (linux/sock_diag.h).
const (
	skMemRmemAlloc = iota
	skMemRcvbuf
	skMemWmemAlloc
	skMemSndbuf
	skMemFwdAlloc
	skMemWmemQueued
	skMemOptmem
	skMemBacklog
	skMemDrops
	skMemVars
)

// socketMemory is a socket's SO_MEMINFO.
func socketMemory(fd int) ([skMemVars]uint32, error) {
	var m [skMemVars]uint32
	l := uint32(unsafe.Sizeof(m))
	_, _, errno := unix.Syscall6(unix.SYS_GETSOCKOPT, uintptr(fd), unix.SOL_SOCKET, unix.SO_MEMINFO,
		uintptr(unsafe.Pointer(&m[0])), uintptr(unsafe.Pointer(&l)), 0)
	if errno != 0 {
		return m, errno
	}
	return m, nil
}

// TestSSEKernelSendBuffersBounded: what the kernel holds for SSE sockets counts too. 2,000
// clients that never read, under a fast pgsse.broadcast: each server socket's send buffer stays
// at Config.SSESendBuffer (SO_SNDBUF, fixed), so the host's TCP memory grows by at most twice
// 2,000 × that bound; the clients are evicted (over their outbound limit) with what they did
// not read dropped, so the host's TCP memory is back where it was within 2 s of the evictions
// — but for the test's own clients' receive queues, measured. Before the fix each send buffer
// grew to tcp_wmem's maximum (4 MiB here: 200 such clients held 800 MB) and the sockets pgsse
// closed kept their unsent bytes for as long as the kernel tried to deliver them.
func TestSSEKernelSendBuffersBounded(t *testing.T) {
	const clients = 2000
	// A quarter of the default bound, so that the test costs the (shared) machine 4 × less, and
	// a small --max-outbound-memory, so that the clients' limits in pgsse's queues shrink soon
	// (budget.go) and the evictions come after a few events rather than 4 MiB each.
	const bound = DefaultSSESendBuffer / 4
	ts := startServer(t, "", func(c *Config) {
		c.SSESendBuffer = bound
		c.MaxOutboundMemory = 16 << 20
		c.MaxConnectionsPerSubject = NoLimit
		c.Heartbeat = time.Hour
	})
	allowance := 2 * clients * bound / os.Getpagesize()

	// On loopback the clients' receive queues are host TCP memory too: they are kept small
	// (4 KiB, as a client whose application stopped reading keeps its initial buffer) so that
	// what is measured is pgsse's sockets, and what they hold at the end is measured and
	// subtracted.
	tok := bearerH(token(t, auth.Claims{Streams: []string{"*"}}, time.Hour))
	conns := make([]*sseClient, clients)
	for i := range conns {
		conns[i] = dialWith(t, tinyRcvBuf(4096), ts.Addr().String(), "/streams/flood", tok)
		require.Equal(t, 200, conns[i].Status)
	}
	var sndbuf []uint32
	ts.onLoop(t, func() {
		for _, sc := range ts.conns.list {
			m, err := socketMemory(sc.c.Fd())
			if err == nil {
				sndbuf = append(sndbuf, m[skMemSndbuf])
			}
		}
	})
	require.Len(t, sndbuf, clients)
	for _, b := range sndbuf {
		require.EqualValues(t, bound, b, "every SSE socket's send buffer is the bound (Linux reports the doubled SO_SNDBUF)")
	}
	base := hostTCPPages(t)

	ctx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	// As fast as pgsse takes them: each transaction of 50 broadcasts (distinct payloads: NOTIFY
	// folds duplicates) once pgsse has read the last, so that no backlog piles up in the LISTEN
	// session's socket — host TCP memory too, which would be counted here as the SSE sockets'.
	go func() {
		defer wg.Done()
		pub := connect(t, ts.DSN)
		for ctx.Err() == nil {
			seen := metricValue(t, ts.metrics.notifications)
			_, _ = pub.Exec(ctx, "DO $$ BEGIN FOR i IN 1..50 LOOP PERFORM pgsse.broadcast('flood', i || ':' || repeat('x', 6000)); END LOOP; END $$").ReadAll()
			for ctx.Err() == nil && metricValue(t, ts.metrics.notifications) < seen+50 {
				time.Sleep(time.Millisecond)
			}
		}
	}()
	defer func() { stop(); wg.Wait() }()

	// pgsse's own share, exactly (SO_MEMINFO of its sockets: what their send queues hold) —
	// Linux lets a send queue pass its buffer by one packet, so twice the bound at most.
	serverQueued := func() int {
		n := 0
		ts.onLoop(t, func() {
			for _, sc := range ts.conns.list {
				if m, err := socketMemory(sc.c.Fd()); err == nil {
					n += int(m[skMemWmemQueued])
				}
			}
		})
		return n
	}
	peak, peakQueued := 0, 0
	deadline := time.Now().Add(60 * time.Second)
	for i := 0; metricValue(t, ts.metrics.droppedSlowClient) < clients; i++ {
		peak = max(peak, hostTCPPages(t)-base)
		require.LessOrEqual(t, peak, allowance, "the host's TCP memory grew by more than 2 × %d clients × %d bytes", clients, bound)
		if i%20 == 0 {
			peakQueued = max(peakQueued, serverQueued())
			require.LessOrEqual(t, peakQueued, 2*clients*bound, "pgsse's sockets hold more than 2 × %d clients × %d bytes", clients, bound)
		}
		require.True(t, time.Now().Before(deadline), "not every client was evicted: %v of %d",
			metricValue(t, ts.metrics.droppedSlowClient), clients)
		time.Sleep(5 * time.Millisecond)
	}
	evicted := time.Now()
	stop()
	wg.Wait()
	t.Logf("host TCP memory: baseline %d pages, peak +%d (allowance %d); pgsse's send queues at most %d KiB (allowance %d KiB)",
		base, peak, allowance, peakQueued>>10, 2*clients*bound>>10)

	clientPages := func() int {
		bytes := 0
		for _, c := range conns {
			raw, err := c.conn.(*net.TCPConn).SyscallConn()
			require.NoError(t, err)
			_ = raw.Control(func(fd uintptr) {
				if m, err := socketMemory(int(fd)); err == nil {
					bytes += int(m[skMemRmemAlloc] + m[skMemWmemQueued] + m[skMemFwdAlloc])
				}
			})
		}
		return bytes / os.Getpagesize()
	}
	// What the kernel still holds for pgsse's end of the SSE port (/proc/net/tcp: every socket
	// on the server's port, orphans of closed ones included): the evicted ones hold nothing.
	port := ts.Addr().(*net.TCPAddr).Port
	// The host-wide count also has the rest of the machine in it (other work, the kernel's
	// per-CPU batching of the count): a slack of a sixteenth of the allowance for that. Left
	// alone, the closed sockets kept nearly all they held (+38,000 pages of 64,000 after 2 s).
	slack := max(2048, allowance/16)
	var left, held, unsent, sockets int
	for {
		held = clientPages()
		left = hostTCPPages(t) - base
		unsent, sockets = kernelQueued(t, port)
		if left <= held+slack && unsent == 0 || time.Since(evicted) > 2*time.Second {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Logf("%v after the evictions: +%d pages, of which the clients' receive queues %d; pgsse's sockets on the port: %d holding %d bytes",
		time.Since(evicted).Round(time.Millisecond), left, held, sockets, unsent)
	assert.Zero(t, unsent, "the evicted sockets hold nothing within 2 s")
	assert.LessOrEqual(t, left, held+slack, "the host's TCP memory is back at its baseline within 2 s")
	assert.Zero(t, ts.connCount(t), "every client was closed")

	// What the kernel had not sent was dropped: the client reads what reached it, then a reset.
	_ = conns[0].conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	var err error
	for err == nil {
		_, err = conns[0].r.ReadString('\n')
	}
	assert.ErrorIs(t, err, unix.ECONNRESET, "an evicted non-reader's connection is reset, not closed with unsent data")
}

// kernelQueued sums the bytes the kernel holds (send and receive queues) for the TCP sockets
// whose local port is port, but listeners, from /proc/net/tcp — closed sockets still
// delivering what they held included — and counts those sockets.
func kernelQueued(t testing.TB, port int) (bytes, sockets int) {
	t.Helper()
	b, err := os.ReadFile("/proc/net/tcp")
	require.NoError(t, err)
	want := fmt.Sprintf(":%04X", port)
	for _, line := range strings.Split(string(b), "\n")[1:] {
		f := strings.Fields(line)
		if len(f) < 5 || !strings.HasSuffix(f[1], want) || f[3] == "0A" { // 0A: LISTEN
			continue
		}
		tx, rx, ok := strings.Cut(f[4], ":")
		require.True(t, ok, "tx_queue:rx_queue in %q", line)
		txn, err := strconv.ParseInt(tx, 16, 64)
		require.NoError(t, err)
		rxn, err := strconv.ParseInt(rx, 16, 64)
		require.NoError(t, err)
		bytes += int(txn + rxn)
		sockets++
	}
	return bytes, sockets
}

// connCount is the number of SSE connections open on the loop.
func (ts *testServer) connCount(t testing.TB) int {
	var n int
	ts.onLoop(t, func() { n = len(ts.conns.list) })
	return n
}

// TestSSESendBufferApplied: every socket of the SSE port gets Config.SSESendBuffer as its send
// buffer (Linux reports the doubled SO_SNDBUF), the default's and a configured one; NoLimit
// leaves it to the kernel's autotuning.
func TestSSESendBufferApplied(t *testing.T) {
	for _, tc := range []struct {
		name string
		set  int
		want func(uint32) bool
	}{
		{"default", 0, func(b uint32) bool { return b == DefaultSSESendBuffer }},
		{"configured", 32 << 10, func(b uint32) bool { return b == 32<<10 }},
		{"no limit", NoLimit, func(b uint32) bool { return b != DefaultSSESendBuffer }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ts := startServer(t, "", func(c *Config) { c.SSESendBuffer = tc.set })
			c := dial(t, ts.Addr().String(), "/streams/x", bearerH(allStreams(t)))
			require.Equal(t, 200, c.Status)
			var got []uint32
			ts.onLoop(t, func() {
				for _, sc := range ts.conns.list {
					m, err := socketMemory(sc.c.Fd())
					require.NoError(t, err)
					got = append(got, m[skMemSndbuf])
				}
			})
			require.Len(t, got, 1)
			assert.True(t, tc.want(got[0]), "send buffer %d", got[0])
		})
	}
}
