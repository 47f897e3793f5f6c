package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pgsse/pgsse/engine"
	"github.com/pgsse/pgsse/framing"
)

// SIGUSR2 with --procs N (SPEC §6: "every process is replaced the same way";
// docs/architecture.md, Siblings across a handoff). Each sibling of the predecessor hands its
// connections over to the successor's sibling of the same slot, by the same conversation as the
// first process's (handoff.go), on a socket pair the successor makes:
//
//  1. The successor (if its --procs is the predecessor's: the marker's Siblings) makes one
//     socketpair per slot, keeps one end for its new sibling of that slot (descriptor
//     siblingHandoffFD, siblingMarker.Handoff) and sends the other to the predecessor right
//     after its 'H', whose body then says how many follow: 'H' u8 version u8 n, then n × 'P' u8
//     slot with the descriptor by SCM_RIGHTS.
//  2. The predecessor forwards each to its sibling of that slot over their control socket
//     (descriptor siblingCtlFD in the sibling, made with the hub's socketpair at its start):
//     'P' with the descriptor. No live sibling in the slot: the descriptor is closed, the new
//     sibling finds nothing to take over and its first process restarts it as usual.
//  3. The old sibling runs the predecessor's side over it — 'L' (its --listen socket, which the
//     new sibling serves on: no SO_REUSEPORT socket of the group closes, so no connection
//     waiting in a backlog is reset), 'H', 'C'/'R' with a mark of its own (LISTENed through
//     the predecessor's hub; the new sibling LISTENs it and the channels through the
//     successor's: both hubs' sessions see the same notifications after it) — and says ready
//     ('r', or 'f' and why) to its first process, and waits.
//  4. The predecessor's first process stops accepting only once its successor and every
//     forwarded sibling are ready; else it tells them 'X' (they let go, the new ones stop) and
//     everybody keeps serving, with one log line. Then it tells each 'G': each sibling stops
//     accepting and moves its connections exactly as the first process does (handOverAll),
//     in parallel with it, and exits 0; its first process does not restart it, waits for it
//     (bounded: siblingHandoffWait) and only then exits in turn — its hub feeds the old
//     siblings' connections until they are handed over.
const (
	siblingHandoffWait = handoffMoveTimeout + 15*time.Second
	// handoffSiblingExitEnv makes a successor's sibling exit at once, or with "hang" never say
	// ready (tests only: the failure paths of a new sibling).
	handoffSiblingExitEnv = "PGSSE_INTERNAL_HANDOFF_SIBLING_EXIT"
)

// handingSibling is one of the predecessor's siblings asked to hand over ('P' forwarded).
type handingSibling struct {
	slot, pid int
	ctl       *net.UnixConn
	ready     chan error // its 'r' (nil) or 'f', once
	gone      <-chan struct{}
}

// setHandoffs gives slots' first starts the sockets to take over on (a successor's
// siblings; before start); restarts wait for releaseRestarts.
func (sv *supervisor) setHandoffs(files map[int]*os.File) {
	if len(files) > 0 {
		sv.hold = make(chan struct{})
	}
	for slot, f := range files {
		if slot >= 1 && slot <= len(sv.slots) {
			sv.slots[slot-1].handoff = f
		} else {
			_ = f.Close()
		}
	}
}

// releaseRestarts lets restarts held by setHandoffs go ahead (the takeover is over).
func (sv *supervisor) releaseRestarts() {
	if sv.hold != nil {
		sv.holdOnce.Do(func() { close(sv.hold) })
	}
}

// forward sends fd (closed here) to the live sibling of slot ('P'): it hands over on it. nil
// if no sibling runs there or it cannot be told.
func (sv *supervisor) forward(slot, fd int) *handingSibling {
	defer closeFDs([]int{fd})
	sv.mu.Lock()
	defer sv.mu.Unlock()
	if slot < 1 || slot > len(sv.slots) {
		return nil
	}
	sl := sv.slots[slot-1]
	if sl.pid == 0 || sl.ctl == nil {
		return nil
	}
	_ = sl.ctl.SetWriteDeadline(time.Now().Add(time.Second))
	err := writeFrame(sl.ctl, 'P', nil, []int{fd})
	_ = sl.ctl.SetWriteDeadline(time.Time{})
	if err != nil {
		sv.log.Warn("handoff: cannot reach a sibling process; it drains instead", "slot", slot, "err", err)
		return nil
	}
	hs := &handingSibling{slot: slot, pid: sl.pid, ctl: sl.ctl, ready: make(chan error, 1)}
	go func() {
		typ, body, fds, err := readFrame(hs.ctl)
		closeFDs(fds)
		switch {
		case err != nil:
			hs.ready <- fmt.Errorf("it went away (%v)", err)
		case typ == 'r':
			hs.ready <- nil
		default:
			hs.ready <- errors.New(string(body))
		}
	}()
	return hs
}

// commit marks hs's sibling as handing over for good ('G' next): its exit is not restarted,
// and hs.gone is closed by it. False if it is no longer the sibling that said ready.
func (sv *supervisor) commit(hs *handingSibling) bool {
	sv.mu.Lock()
	defer sv.mu.Unlock()
	sl := sv.slots[hs.slot-1]
	if sl.pid != hs.pid {
		return false
	}
	gone := make(chan struct{})
	sl.committed, sl.gone = true, gone
	hs.gone = gone
	return true
}

// tell sends one control frame to a sibling (best effort: one that is gone is found by its exit).
func (hs *handingSibling) tell(typ byte) error {
	_ = hs.ctl.SetWriteDeadline(time.Now().Add(time.Second))
	defer hs.ctl.SetWriteDeadline(time.Time{})
	return writeFrame(hs.ctl, typ, nil, nil)
}

// siblingsReady waits until every forwarded sibling said ready, until deadline.
func siblingsReady(sibs []*handingSibling, deadline time.Time) (slot int, err error) {
	for _, hs := range sibs {
		t := time.NewTimer(time.Until(deadline))
		select {
		case err = <-hs.ready:
		case <-t.C:
			err = errors.New("not ready within " + readyTimeout().String())
		}
		t.Stop()
		if err != nil {
			return hs.slot, err
		}
	}
	return 0, nil
}

// abortSiblings tells every forwarded sibling that the handoff is off ('X').
func abortSiblings(sibs []*handingSibling) {
	for _, hs := range sibs {
		_ = hs.tell('X')
	}
}

// --- the successor's first process -------------------------------------------------------

// siblingPairs makes, for slots 1 … n, the socket pairs over which the predecessor's siblings
// hand over to this successor's: ours (for the new siblings) and theirs (for 'P').
func siblingPairs(n int) (ours map[int]*os.File, theirs []int, err error) {
	ours = make(map[int]*os.File, n)
	for slot := 1; slot <= n; slot++ {
		fds, err := siblingSocketpair()
		if err != nil {
			for _, f := range ours {
				_ = f.Close()
			}
			closeFDs(theirs)
			return nil, nil, err
		}
		ours[slot] = os.NewFile(uintptr(fds[0]), "pgsse-sibling-handoff")
		theirs = append(theirs, fds[1])
	}
	return ours, theirs, nil
}

// --- an old sibling ------------------------------------------------------------------------

// siblingHandoff is a sibling's side: its control socket with its first process, read on
// one goroutine (serve); a 'P' runs one handover, whose outcome goes to handed (true: this
// process has handed everything over and stops).
type siblingHandoff struct {
	log    *slog.Logger
	srv    *engine.Server
	ctl    *net.UnixConn
	cmds   chan byte // 'G' or 'X' from the first process, for the handover running
	handed chan<- bool
	busy   atomic.Bool // a handover runs, or this sibling is still taking over itself
	ctlMu  sync.Mutex  // writes to ctl
}

func (sh *siblingHandoff) serve() {
	for {
		typ, _, fds, err := readFrame(sh.ctl)
		if err != nil {
			return // the first process is gone: watchParent decides what follows
		}
		switch {
		case typ == 'P' && (len(fds) != 1 || !sh.busy.CompareAndSwap(false, true)):
			// One answer per 'P', so that its first process waits for none in vain.
			closeFDs(fds)
			sh.answer('f', "this sibling is busy (taking over, or handing over already)")
		case typ == 'P':
			select {
			case <-sh.cmds: // a previous handover's, unread
			default:
			}
			go func(fd int) {
				ok := sh.run(fd)
				if !ok {
					sh.busy.Store(false)
				}
				select {
				case sh.handed <- ok:
				default:
				}
			}(fds[0])
		case typ == 'G' || typ == 'X':
			closeFDs(fds)
			select {
			case sh.cmds <- typ:
			default:
			}
		default:
			closeFDs(fds)
		}
	}
}

// run hands this sibling's connections over on fd to the successor's sibling of its slot.
func (sh *siblingHandoff) run(fd int) bool {
	began := time.Now()
	log := sh.log
	conn, err := unixConnFD(fd)
	fail := func(why string, err error) bool {
		log.Warn("handoff: this sibling keeps serving: "+why, "err", err)
		sh.answer('f', why+": "+errText(err))
		return false
	}
	if err != nil {
		return fail("the successor's sibling's socket", err)
	}
	defer conn.Close()
	sseFD, _, err := sh.srv.ListenerFDs()
	if err != nil {
		return fail("cannot share --listen", err)
	}
	err = writeFrame(conn, 'L', nil, []int{sseFD})
	closeFDs([]int{sseFD})
	if err != nil {
		return fail("the successor's sibling went away", err)
	}
	deadline := began.Add(readyTimeout())
	_ = conn.SetReadDeadline(deadline)
	if n, why, err := readHello(conn); why != "" || err != nil || n != 0 {
		if why == "" {
			why = "the successor's sibling did not answer"
		}
		return fail(why, err)
	}
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	mark, err := sh.srv.BeginHandoff(ctx)
	if err != nil {
		sh.srv.EndHandoff()
		return fail("cannot LISTEN the handoff mark's channel", err)
	}
	if err := sendChannels(ctx, sh.srv, conn, mark); err != nil {
		sh.srv.EndHandoff()
		return fail("the successor's sibling did not LISTEN our channels", err)
	}
	_ = conn.SetReadDeadline(time.Time{})
	if err := sh.answer('r', ""); err != nil {
		sh.srv.EndHandoff()
		return false
	}
	// The first process says go once its successor and every sibling's are ready.
	t := time.NewTimer(time.Until(deadline.Add(10 * time.Second)))
	defer t.Stop()
	select {
	case c := <-sh.cmds:
		if c != 'G' {
			sh.srv.EndHandoff()
			log.Info("handoff called off by the first process; serving on")
			return false
		}
	case <-t.C:
		sh.srv.EndHandoff()
		log.Warn("handoff: the first process did not say go; serving on")
		return false
	}
	sh.srv.StopAcceptingAll()
	handed, adopted, tookOver := handOverAll(log, sh.srv, conn, mark)
	if !tookOver {
		return false // serving what we have, accepting no more: the first process's SIGTERM drains it
	}
	log.Info("handed this sibling's connections over to the successor's; exiting",
		"connections", handed, "adopted", adopted, "took", time.Since(began).Round(time.Millisecond).String())
	return true
}

// answer tells the first process how a 'P' went: 'r' (ready) or 'f' and why. Only serve's
// goroutine and the one handover running write, never both for one 'P'.
func (sh *siblingHandoff) answer(typ byte, why string) error {
	sh.ctlMu.Lock()
	defer sh.ctlMu.Unlock()
	_ = sh.ctl.SetWriteDeadline(time.Now().Add(time.Second))
	defer sh.ctl.SetWriteDeadline(time.Time{})
	return writeFrame(sh.ctl, typ, []byte(why), nil)
}

func errText(err error) string {
	if err == nil {
		return "-"
	}
	return err.Error()
}

// siblingCtl opens a sibling's control socket (siblingCtlFD).
func siblingCtl() (*net.UnixConn, error) {
	c, err := unixConnFD(siblingCtlFD)
	if err != nil {
		return nil, fmt.Errorf("%s: descriptor %d (the control socket): %v", siblingEnv, siblingCtlFD, err)
	}
	return c, nil
}

// sibling's successor marker: what a new sibling in handoff mode takes over under.
func siblingSuccessorMarker(m *siblingMarker) *handoffMarker {
	return &handoffMarker{Version: framing.HandoffVersion, Parent: m.Parent}
}
