package engine

import (
	"context"
	"net"
	"runtime"
	"testing"
	"time"

	"github.com/panjf2000/gnet/v2"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A task pushed while thousands of clients have just closed their connections runs before
// the loop has handled most of those closes: gnet's poller reaches its wake-up descriptor only
// after every socket that became ready before it, so without Server.hurry the task (a
// delivery, in production) waited for all of them (bench scenario 12's leaving churn).
func TestLoop_TaskNotBehindACloseStorm(t *testing.T) {
	ts := startServer(t, "", nil)
	const n = 4000
	conns := make([]net.Conn, 0, n)
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	d := net.Dialer{Timeout: 10 * time.Second}
	for range n {
		c, err := d.Dial("tcp", ts.Addr().String())
		require.NoError(t, err)
		conns = append(conns, c)
	}
	waitFor(t, 30*time.Second, "every connection open on the loop", func() bool { return ts.conns.opened.Load() == n })

	// Hold the loop in a gnet task of its own (not one of ours: the drain would run the
	// measured task right after it) while every client closes, so that all n sockets are
	// ready when the loop goes back to its poller.
	release, holding := make(chan struct{}), make(chan struct{})
	require.NoError(t, ts.tasks.loop.Execute(context.Background(), gnet.RunnableFunc(func(context.Context) error {
		close(holding)
		<-release
		return nil
	})))
	<-holding
	for _, c := range conns {
		c.Close()
	}
	conns = conns[:0]
	openAtRun := make(chan int64, 1)
	close(release)
	// Push once the loop is handling the closes (past the gnet task pass, in which a drain
	// scheduled now would run at once): the wake-up then queues behind the sockets left.
	for ts.conns.opened.Load() == n {
		runtime.Gosched()
	}
	pushedAt := ts.conns.opened.Load()
	require.True(t, ts.tasks.push(func() { openAtRun <- ts.conns.opened.Load() }))
	var open int64
	select {
	case open = <-openAtRun:
	case <-time.After(30 * time.Second):
		t.Fatal("the task did not run")
	}
	handled := pushedAt - open
	t.Logf("closes handled after the task was pushed and before it ran: %d of the %d left", handled, pushedAt)
	require.Greater(t, pushedAt, int64(n/10), "the loop handled most closes before the test could push (nothing to show)")
	assert.Less(t, handled, pushedAt/2, "the task waited behind the close storm")
	waitFor(t, 30*time.Second, "every close handled", func() bool { return ts.conns.opened.Load() == 0 })
}
