package main

import (
	"net"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// unixPair is a connected pair of Unix stream sockets.
func unixPair(t *testing.T) (*net.UnixConn, *net.UnixConn) {
	t.Helper()
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	require.NoError(t, err)
	conn := func(fd int) *net.UnixConn {
		f := os.NewFile(uintptr(fd), "pair")
		c, err := net.FileConn(f)
		_ = f.Close()
		require.NoError(t, err)
		t.Cleanup(func() { c.Close() })
		return c.(*net.UnixConn)
	}
	return conn(fds[0]), conn(fds[1])
}

// A sibling answers every 'P' of its first process: one it cannot take (it is busy taking
// over itself, or the frame carries no socket) gets an 'f' at once, so that the first process
// calls the handoff off instead of waiting out the ready timeout for an answer that never comes.
func TestSiblingHandoffAnswersEveryP(t *testing.T) {
	first, ctl := unixPair(t)
	sh := &siblingHandoff{ctl: ctl, cmds: make(chan byte, 1), handed: make(chan bool, 1)}
	sh.busy.Store(true) // taking over itself
	done := make(chan struct{})
	go func() { defer close(done); sh.serve() }()

	_, spare := unixPair(t)
	fd, err := dupConnFD(spare)
	require.NoError(t, err)
	require.NoError(t, writeFrame(first, 'P', nil, []int{fd}))
	closeFDs([]int{fd})
	require.NoError(t, writeFrame(first, 'P', nil, nil))
	for range 2 {
		_ = first.SetReadDeadline(time.Now().Add(5 * time.Second))
		typ, body, fds, err := readFrame(first)
		require.NoError(t, err, "an answer to each P")
		assert.Empty(t, fds)
		assert.Equal(t, byte('f'), typ)
		assert.Contains(t, string(body), "busy")
	}
	first.Close()
	<-done // serve ends with its first process
	assert.Empty(t, sh.handed, "no handover ran")
}

func dupConnFD(c *net.UnixConn) (int, error) {
	rc, err := c.SyscallConn()
	if err != nil {
		return -1, err
	}
	fd := -1
	var derr error
	if err := rc.Control(func(f uintptr) { fd, derr = syscall.Dup(int(f)) }); err != nil {
		return -1, err
	}
	return fd, derr
}
