//go:build linux

package engine

import (
	"context"

	"golang.org/x/sys/unix"
)

// The writability set (Linux): every connection that ever queued is registered once,
// edge-triggered, for EPOLLOUT in a private epoll set, and watchWritable, a goroutine blocked
// in epoll_wait on that set, hands the sockets that have room again to the loop as one task
// (and waits for it before it looks again). With edge triggering the kernel reports a socket
// only after a write found it full, which is exactly when its queue needs a write.

// pollQueues: the tick need not poll the queues (watchWritable reports the sockets).
const pollQueues = false

func (o *outbound) init() error {
	o.epfd, o.stopFD = -1, -1
	fd, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		return err
	}
	o.epfd = fd
	if o.stopFD, err = unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK); err != nil {
		o.close()
		return err
	}
	ev := unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(o.stopFD)}
	if err := unix.EpollCtl(o.epfd, unix.EPOLL_CTL_ADD, o.stopFD, &ev); err != nil {
		o.close()
		return err
	}
	o.byFD = make(map[int32]*sseConn)
	o.readyDone = make(chan struct{}, 1)
	return nil
}

func (o *outbound) close() {
	for _, fd := range []*int{&o.epfd, &o.stopFD} {
		if *fd >= 0 {
			_ = unix.Close(*fd)
			*fd = -1
		}
	}
}

// stopWatching ends watchWritable (from Run, after its context was cancelled).
func (o *outbound) stopWatching() {
	if o.stopFD >= 0 {
		var one = [8]byte{1}
		_, _ = unix.Write(o.stopFD, one[:])
	}
}

// watchWritable runs beside the loop (Run) until ctx ends (stopWatching wakes it): it waits in
// epoll_wait for sockets of the writability set that have room again and hands them to the
// loop as one task, waiting for that task before it looks again.
func (s *Server) watchWritable(ctx context.Context) {
	events := make([]unix.EpollEvent, writableEventsMax)
	s.out.flushTask = func() {
		s.enter()
		defer s.leave()
		s.flushReady(s.out.ready)
		s.out.readyDone <- struct{}{}
	}
	for ctx.Err() == nil {
		n, err := unix.EpollWait(s.out.epfd, events, -1)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			s.log.Error("waiting for SSE sockets to have room failed; queues now drain on the sweep only", "err", err)
			return
		}
		ready := s.out.ready[:0]
		for _, ev := range events[:n] {
			if ev.Fd != int32(s.out.stopFD) {
				ready = append(ready, ev.Fd)
			}
		}
		if len(ready) == 0 {
			continue
		}
		s.out.ready = ready
		if !s.tasks.push(s.out.flushTask) {
			return
		}
		select {
		case <-s.out.readyDone:
		case <-ctx.Done():
			return
		}
	}
}

// watch registers sc's socket in the writability set (once per connection).
func (s *Server) watch(sc *sseConn) {
	if sc.watched || s.out.epfd < 0 {
		return
	}
	fd := sc.c.Fd()
	ev := unix.EpollEvent{Events: unix.EPOLLOUT | unix.EPOLLET, Fd: int32(fd)}
	err := unix.EpollCtl(s.out.epfd, unix.EPOLL_CTL_ADD, fd, &ev)
	if err == unix.EEXIST {
		err = unix.EpollCtl(s.out.epfd, unix.EPOLL_CTL_MOD, fd, &ev)
	}
	if err != nil {
		// The sweep still retries the queue (queueRetryMS); nothing is lost but latency.
		s.log.Warn("cannot watch an SSE socket for writability; its queue drains on the sweep", "err", err)
		return
	}
	sc.watched = true
	s.out.byFD[int32(fd)] = sc
}

// unwatch forgets sc's socket (it is about to be closed, which also removes it from the set).
func (s *Server) unwatch(sc *sseConn) {
	if !sc.watched {
		return
	}
	sc.watched = false
	fd := int32(sc.c.Fd())
	if s.out.byFD[fd] == sc {
		delete(s.out.byFD, fd)
	}
}

// flushReady writes the queues of sockets that have room again (watchWritable's task): SSE
// connections' and hub workers'.
func (s *Server) flushReady(fds []int32) {
	for _, fd := range fds {
		if sc := s.out.byFD[fd]; sc != nil {
			if !sc.closed {
				s.flushQueue(sc)
			}
		} else if w := s.hub.byFD[fd]; w != nil {
			s.hub.writable(w)
		}
	}
}

// watchWorker arms w's socket in the writability set for one report (EPOLLONESHOT): the hub
// re-arms it each time it finds the socket full, so a worker that reads everything costs no
// wake-ups. Armed while the socket already has room, it is reported at once.
func (s *Server) watchWorker(w *worker) {
	if s.out.epfd < 0 || w.gone {
		return
	}
	fd := w.c.Fd()
	ev := unix.EpollEvent{Events: unix.EPOLLOUT | unix.EPOLLONESHOT, Fd: int32(fd)}
	op := unix.EPOLL_CTL_MOD
	if !w.watched {
		op = unix.EPOLL_CTL_ADD
	}
	err := unix.EpollCtl(s.out.epfd, op, fd, &ev)
	switch {
	case err == unix.EEXIST:
		err = unix.EpollCtl(s.out.epfd, unix.EPOLL_CTL_MOD, fd, &ev)
	case err == unix.ENOENT:
		err = unix.EpollCtl(s.out.epfd, unix.EPOLL_CTL_ADD, fd, &ev)
	}
	if err != nil {
		// The tick still writes to it (tickFast while it has bytes queued); nothing is lost.
		s.log.Warn("hub: cannot watch a worker's socket for room; it is written on the tick", "pid", w.pid, "err", err)
		return
	}
	if !w.watched {
		w.watched = true
		if s.hub.byFD == nil {
			s.hub.byFD = make(map[int32]*worker)
		}
		s.hub.byFD[int32(fd)] = w
	}
}

// unsentBytes is what the kernel holds for fd's peer that the peer has not acknowledged yet
// (SIOCOUTQ); 0 if it cannot tell.
func unsentBytes(fd int) int {
	n, err := unix.IoctlGetInt(fd, unix.SIOCOUTQ)
	if err != nil {
		return 0
	}
	return n
}
