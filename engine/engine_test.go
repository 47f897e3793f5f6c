package engine

import (
	"context"
	"net"
	"runtime"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgsse/pgsse/auth"
)

func TestLiveAndReplay(t *testing.T) {
	ts := startServer(t, "", nil)
	pub := connect(t, ts.DSN)
	tok := token(t, auth.Claims{Streams: []string{"orders/*"}}, time.Hour)

	// Two events before anyone connects.
	require.Equal(t, int64(1), publish(t, pub, "orders/1", "one", "", nil))
	require.Equal(t, int64(2), publish(t, pub, "orders/1", "two\nlines", "update", nil))

	live := dial(t, ts.Addr().String(), "/streams/orders/1", "Authorization: Bearer "+tok)
	require.Equal(t, 200, live.Status, live.Body)
	assert.Equal(t, "text/event-stream; charset=utf-8", live.Header.Get("Content-Type"))
	first := live.mustNext(5 * time.Second)
	assert.Equal(t, "2000", first.Retry, "the body starts with retry: <--retry>")

	replay := dial(t, ts.Addr().String(), "/streams/orders/1?since=0&token="+tok)
	require.Equal(t, 200, replay.Status, replay.Body)
	ev := replay.mustNextData(5 * time.Second)
	assert.Equal(t, sseEvent{HasID: true, IDValue: "1", Data: "one"}, ev)
	ev = replay.mustNextData(5 * time.Second)
	assert.Equal(t, sseEvent{HasID: true, IDValue: "2", Event: "update", Data: "two\nlines"}, ev)

	require.Equal(t, int64(3), publish(t, pub, "orders/1", "three", "", nil))
	for _, c := range []*sseClient{live, replay} {
		ev := c.mustNextData(5 * time.Second)
		assert.Equal(t, sseEvent{HasID: true, IDValue: "3", Data: "three"}, ev)
	}
}

// TestListenAddressInUse: a busy --listen address is reported as such (gnet would mask it
// as EBADF if TCP keepalive were set on the listener), and nothing is left running.
func TestListenAddressInUse(t *testing.T) {
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer busy.Close()
	srv, err := New(Config{DatabaseURL: migratedDB(t), Listen: busy.Addr().String(), Auth: auth.Config{Secret: []byte(testSecret)}})
	require.NoError(t, err)
	err = srv.Run(context.Background())
	require.Error(t, err)
	assert.Contains(t, err.Error(), "--listen "+busy.Addr().String())
	assert.Contains(t, err.Error(), "address already in use")
}

// A stopped server is garbage: nothing process-wide (gnet keeps engines in a global map by
// address) holds on to it, its replay queue or its verifier pool — a process that runs many
// servers (the tests) would otherwise keep every one of them.
func TestStoppedServerIsFreed(t *testing.T) {
	ts := startServer(t, "", nil)
	freed := make(chan struct{})
	runtime.AddCleanup(ts.Server, func(ch chan struct{}) { close(ch) }, freed)
	ts.Stop(t)
	ts.Server = nil
	deadline := time.Now().Add(20 * time.Second)
	for {
		runtime.GC()
		select {
		case <-freed:
			return
		default:
		}
		if time.Now().After(deadline) {
			t.Fatal("a stopped server is still referenced")
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestLoopAnchorIsNoClient: the loopback connection the engine enrols to hold its event loop
// is not mistaken for an SSE client (which its head timeout would close after 10 s).
func TestLoopAnchorIsNoClient(t *testing.T) {
	ts := startServer(t, "", nil)
	conns := -1
	ts.onLoop(t, func() { conns = len(ts.conns.list) })
	assert.Equal(t, 0, conns)
}
