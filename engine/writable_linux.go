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
func (o *outbound) watchWritable(ctx context.Context) {
	events := make([]unix.EpollEvent, writableEventsMax)
	o.flushTask = func() { // a task: the drain's enter/leave bracket it
		o.flushReady(o.ready)
		o.readyDone <- struct{}{}
	}
	for ctx.Err() == nil {
		n, err := unix.EpollWait(o.epfd, events, -1)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			o.log.Error("waiting for SSE sockets to have room failed; queues now drain on the sweep only", "err", err)
			return
		}
		ready := o.ready[:0]
		for _, ev := range events[:n] {
			if ev.Fd != int32(o.stopFD) {
				ready = append(ready, ev.Fd)
			}
		}
		if len(ready) == 0 {
			continue
		}
		o.ready = ready
		if !o.tasks.push(o.flushTask) {
			return
		}
		select {
		case <-o.readyDone:
		case <-ctx.Done():
			return
		}
	}
}

// watch registers sc's socket in the writability set (once per connection).
func (o *outbound) watch(sc *sseConn) {
	if o.epfd < 0 {
		return
	}
	fd := sc.c.Fd()
	if o.byFD[int32(fd)] == sc {
		return
	}
	ev := unix.EpollEvent{Events: unix.EPOLLOUT | unix.EPOLLET, Fd: int32(fd)}
	err := unix.EpollCtl(o.epfd, unix.EPOLL_CTL_ADD, fd, &ev)
	if err == unix.EEXIST {
		err = unix.EpollCtl(o.epfd, unix.EPOLL_CTL_MOD, fd, &ev)
	}
	if err != nil {
		// The sweep still retries the queue (queueRetryMS); nothing is lost but latency.
		o.log.Warn("cannot watch an SSE socket for writability; its queue drains on the sweep", "err", err)
		return
	}
	o.byFD[int32(fd)] = sc
}

// unwatch forgets sc's socket (it is about to be closed, which also removes it from the set).
func (o *outbound) unwatch(sc *sseConn) {
	if len(o.byFD) == 0 {
		return
	}
	fd := int32(sc.c.Fd())
	if o.byFD[fd] == sc {
		delete(o.byFD, fd)
	}
}

// flushReady writes the queues of sockets that have room again (watchWritable's task).
func (o *outbound) flushReady(fds []int32) {
	for _, fd := range fds {
		if sc := o.byFD[fd]; sc != nil && !sc.closed {
			o.flushQueue(sc)
		}
	}
}
