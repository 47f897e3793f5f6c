package main

import (
	"errors"
	"net"
	"net/http"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// The admin endpoint's connections (docs/operations.md, Health, metrics and logs). At most
// --admin-max-connections are open at once (engine.Server.AdminListener, which also contains
// EMFILE); so that idle ones cannot hold the cap — 64 connections that sent nothing, or one
// request each and then kept alive, locked /healthz out for 10 s or a minute (issue 23) — a
// connection that arrives while the cap is reached closes the connection that has been idle
// longest (no request in progress: never sent one, or between keep-alive requests), and
// idle connections are short-lived anyway (adminReadHeaderTimeout, adminIdleTimeout). Only
// when every connection is busy with a request does the newcomer wait in the kernel's
// backlog, as before.
const (
	adminReadHeaderTimeout = 5 * time.Second  // a request head must arrive within this
	adminIdleTimeout       = 30 * time.Second // a keep-alive connection without a request is closed
)

// adminConns tracks the admin server's connections through http.Server.ConnState.
type adminConns struct {
	mu    sync.Mutex
	conns map[net.Conn]adminConnState
}

type adminConnState struct {
	idle      bool      // no request in progress
	idleSince time.Time // when it became idle
}

func newAdminConns() *adminConns { return &adminConns{conns: make(map[net.Conn]adminConnState)} }

// connState is the http.Server's ConnState hook.
func (a *adminConns) connState(c net.Conn, st http.ConnState) {
	a.mu.Lock()
	defer a.mu.Unlock()
	switch st {
	case http.StateNew, http.StateIdle:
		if _, known := a.conns[c]; known || st == http.StateNew {
			a.conns[c] = adminConnState{idle: true, idleSince: time.Now()}
		}
	case http.StateActive:
		if _, known := a.conns[c]; known {
			a.conns[c] = adminConnState{}
		}
	case http.StateClosed, http.StateHijacked:
		delete(a.conns, c)
	}
}

func (a *adminConns) open() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.conns)
}

// evictIdlest closes the connection idle longest; false if none is idle. It is forgotten at
// once, so the count is right before net/http notices the close.
func (a *adminConns) evictIdlest() bool {
	a.mu.Lock()
	var victim net.Conn
	var since time.Time
	for c, st := range a.conns {
		if st.idle && (victim == nil || st.idleSince.Before(since)) {
			victim, since = c, st.idleSince
		}
	}
	if victim != nil {
		delete(a.conns, victim)
	}
	a.mu.Unlock()
	if victim == nil {
		return false
	}
	_ = victim.Close() // gives its slot in the engine's cap back
	return true
}

// evictingListener is the admin server's listener: the engine's capped one (capped), and the
// socket under it (raw), on which it waits for a connection to arrive while the cap is reached.
type evictingListener struct {
	net.Listener
	raw   syscall.RawConn
	max   int
	conns *adminConns
}

// newEvictingListener wraps capped, the engine's AdminListener over ln, with at most max
// connections tracked by conns.
func newEvictingListener(ln, capped net.Listener, max int, conns *adminConns) (net.Listener, error) {
	sc, ok := ln.(syscall.Conn)
	if !ok {
		return nil, errors.New("admin listener has no descriptor")
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return nil, err
	}
	return &evictingListener{Listener: capped, raw: raw, max: max, conns: conns}, nil
}

// Accept: at the cap, it waits until a connection is waiting to be accepted, then makes room
// by closing the idlest connection, and accepts.
func (l *evictingListener) Accept() (net.Conn, error) {
	for l.conns.open() >= l.max {
		if err := l.waitPending(); err != nil {
			return nil, err
		}
		if l.conns.open() < l.max || !l.conns.evictIdlest() {
			break // room meanwhile, or every connection is busy: wait for a slot in the engine's Accept
		}
	}
	return l.Listener.Accept()
}

// adminPollInterval bounds one wait of waitPending, so that closing the listener (which waits
// for the wait to end) is not held up.
const adminPollInterval = 100 * time.Millisecond

// waitPending returns once a connection waits in the socket's backlog, or with an error once
// the socket is closed. It polls the descriptor itself: a listener's RawConn has no Read that
// would wait on the runtime's poller, and Control keeps the descriptor from being closed (and
// its number reused) while poll(2) looks at it.
func (l *evictingListener) waitPending() error {
	for {
		ready := false
		err := l.raw.Control(func(fd uintptr) {
			pfd := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
			n, err := unix.Poll(pfd, int(adminPollInterval/time.Millisecond))
			ready = err == nil && n > 0 && pfd[0].Revents&unix.POLLIN != 0
		})
		if err != nil {
			return net.ErrClosed
		}
		if ready {
			return nil
		}
	}
}
