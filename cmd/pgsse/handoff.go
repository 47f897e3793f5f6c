package main

import (
	"context"
	bin "encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/pgsse/pgsse/engine"
	"github.com/pgsse/pgsse/framing"
)

// SIGUSR2: upgrades no client notices (SPEC §6; docs/operations.md, Upgrading without
// disconnects). The process that gets it (the predecessor) starts the executable at its own
// path — the new version, once installed — with the same arguments and environment, as its
// successor, handing it at start (os/exec ExtraFiles) one end of a socketpair (descriptor 3).
// Over the socketpair, in frames of u32 length (of what follows), u8 type, body:
//
//	predecessor → successor   'L'                     the listeners by SCM_RIGHTS: --listen, then
//	                                                  the hub socket and the admin listener if
//	                                                  handoffMarker says so (not ExtraFiles:
//	                                                  os.File.Fd would make them blocking for
//	                                                  the predecessor's acceptors too)
//	successor → predecessor   'H' u8 version [u8 n]   at once: the handoff version it speaks;
//	                                                  with n, n 'P' frames follow (--procs)
//	successor → predecessor   'P' u8 slot             a socket for the predecessor's sibling of
//	                                                  that slot to hand over on (SCM_RIGHTS;
//	                                                  prochandoff.go)
//	predecessor → successor   'C' record              the raw channels it holds and its handoff
//	                                                  mark's (framing.HandoffChannels)
//	successor → predecessor   'R'                     its LISTEN session is up and every one of
//	                                                  them is LISTENed: ready
//	                          (the predecessor stops accepting, then 'C' and 'R' once more: the
//	                          channels it took on meanwhile; then it notifies its mark)
//	predecessor → successor   'A'                     the predecessor no longer accepts: accept
//	predecessor → successor   'B' u16 n, n × (u32 len, record)   n connections (≤ 64), their
//	                                                  descriptors by SCM_RIGHTS on the same message
//	predecessor → successor   'D'                     that was all
//	successor → predecessor   'K' u32 n               n connections adopted: it serves (its
//	                                                  presence registered first, replacing the
//	                                                  predecessor's entries: engine's TakeOverPresence)
//
// The records are framing's handoff records (framing/handoff.go, fuzzed). If the successor
// cannot start, exits, speaks another version or is not ready within handoffReadyTimeout,
// the predecessor kills it and keeps serving everything, logging one line; it never stopped
// accepting. With --procs, it stops accepting only once every sibling it forwarded a 'P' to
// is ready too, and it waits for them to have handed over before it exits (prochandoff.go).
// Once 'K' is in, the predecessor tells systemd the main PID is the successor's
// (sd_notify MAINPID=, handoffNotify) and exits 0 after answering what it still had in
// progress. A SIGUSR2 during a handoff is ignored with a log line.
//
// The channels and the mark make the raw channels' move exact (docs/architecture.md,
// Handoff positions): the successor LISTENs every channel before the predecessor lets go of
// any subscription, the mark — notified after the last 'R' — is where both processes start
// counting each channel's notifications, a record says where its subscription stood in that
// count, and the successor keeps what arrives meanwhile to give it exactly what it missed.
const (
	handoffEnv          = "PGSSE_INTERNAL_HANDOFF" // JSON handoffMarker; set only by a predecessor
	handoffCtrlFD       = 3
	handoffReadyTimeout = 30 * time.Second // SPEC §6
	handoffMoveTimeout  = 30 * time.Second // moving the connections, and the successor's 'K'
	handoffFrameMax     = 1 << 30
	// handoffAdopting bounds the connections a successor has received but its loop has not
	// taken yet (engine.AdoptAsync): each holds two descriptors meanwhile (the received one,
	// and gnet's duplicate until the loop opens it), so a predecessor that hands over faster
	// than this loop takes them would otherwise run the successor out of descriptors (scenario
	// 17 at 15,000 against a limit of 20,000: EMFILE, batches received with descriptors
	// missing). Past it, the next batch is read once the oldest is on the loop.
	handoffAdopting = 512
	// handoffTimeoutEnv shortens handoffReadyTimeout (tests only: a successor that hangs).
	handoffTimeoutEnv = "PGSSE_INTERNAL_HANDOFF_TIMEOUT"
)

// readyTimeout is handoffReadyTimeout, or what handoffTimeoutEnv says.
func readyTimeout() time.Duration {
	if d, err := time.ParseDuration(os.Getenv(handoffTimeoutEnv)); err == nil && d > 0 {
		return d
	}
	return handoffReadyTimeout
}

// handoffMarker is what a predecessor tells its successor (handoffEnv).
type handoffMarker struct {
	Version int  `json:"version"` // framing.HandoffVersion of the predecessor
	Parent  int  `json:"parent"`  // the predecessor's pid
	Hub     bool `json:"hub"`     // 'L' carries the hub socket's listener
	Admin   bool `json:"admin"`   // 'L' carries the admin listener
	// Siblings: the predecessor's --procs siblings (slots 1 … Siblings) hand over too, if the
	// successor sends their sockets (prochandoff.go).
	Siblings int `json:"siblings,omitempty"`
}

func readHandoffMarker(env func(string) (string, bool)) (*handoffMarker, error) {
	v, ok := env(handoffEnv)
	if !ok || v == "" {
		return nil, nil
	}
	var m handoffMarker
	if err := json.Unmarshal([]byte(v), &m); err != nil || m.Parent < 1 {
		return nil, fmt.Errorf("%s: not a marker set by pgsse serve on SIGUSR2 (it is internal): %q", handoffEnv, v)
	}
	return &m, nil
}

// --- frames -------------------------------------------------------------------------------

func writeFrame(c *net.UnixConn, typ byte, body []byte, fds []int) error {
	b := make([]byte, 5, 5+len(body))
	bin.BigEndian.PutUint32(b, uint32(1+len(body)))
	b[4] = typ
	b = append(b, body...)
	if len(fds) == 0 {
		_, err := c.Write(b)
		return err
	}
	n, _, err := c.WriteMsgUnix(b, unix.UnixRights(fds...), nil)
	if err != nil {
		return err
	}
	if n < len(b) {
		_, err = c.Write(b[n:])
	}
	return err
}

// readFrame reads one frame and the descriptors that came with it. It reads exactly the
// frame's bytes (never into the next frame, whose descriptors would be lost).
func readFrame(c *net.UnixConn) (typ byte, body []byte, fds []int, err error) {
	var hdr [5]byte
	oob := make([]byte, unix.CmsgSpace(4*256))
	n, oobn, _, _, err := c.ReadMsgUnix(hdr[:], oob)
	if err != nil {
		return 0, nil, nil, err
	}
	if n == 0 {
		return 0, nil, nil, io.EOF
	}
	if oobn > 0 {
		msgs, perr := unix.ParseSocketControlMessage(oob[:oobn])
		if perr == nil {
			for _, m := range msgs {
				if got, err := unix.ParseUnixRights(&m); err == nil {
					fds = append(fds, got...)
				}
			}
		}
	}
	closeAll := func() {
		for _, fd := range fds {
			_ = unix.Close(fd)
		}
	}
	if n < len(hdr) {
		if _, err := io.ReadFull(c, hdr[n:]); err != nil {
			closeAll()
			return 0, nil, nil, err
		}
	}
	size := bin.BigEndian.Uint32(hdr[:])
	if size == 0 || size > handoffFrameMax {
		closeAll()
		return 0, nil, nil, fmt.Errorf("handoff: frame of %d bytes", size)
	}
	body = make([]byte, size-1)
	if _, err := io.ReadFull(c, body); err != nil {
		closeAll()
		return 0, nil, nil, err
	}
	return hdr[4], body, fds, nil
}

// batchBody is a 'B' frame's body for conns.
func batchBody(conns []engine.HandedConn) ([]byte, []int) {
	b := bin.BigEndian.AppendUint16(nil, uint16(len(conns)))
	fds := make([]int, len(conns))
	for i, h := range conns {
		b = bin.BigEndian.AppendUint32(b, uint32(len(h.Record)))
		b = append(b, h.Record...)
		fds[i] = h.FD
	}
	return b, fds
}

// parseBatch splits a 'B' body into its records (one per descriptor).
func parseBatch(body []byte, nfds int) ([][]byte, error) {
	if len(body) < 2 {
		return nil, errors.New("handoff: short batch")
	}
	n := int(bin.BigEndian.Uint16(body))
	body = body[2:]
	if n != nfds {
		return nil, fmt.Errorf("handoff: batch of %d records with %d descriptors", n, nfds)
	}
	recs := make([][]byte, 0, n)
	for range n {
		if len(body) < 4 {
			return nil, errors.New("handoff: truncated batch")
		}
		k := bin.BigEndian.Uint32(body)
		body = body[4:]
		if uint64(k) > uint64(len(body)) {
			return nil, errors.New("handoff: truncated batch")
		}
		recs = append(recs, body[:k])
		body = body[k:]
	}
	if len(body) > 0 {
		return nil, errors.New("handoff: bytes after the batch")
	}
	return recs, nil
}

// --- the predecessor ------------------------------------------------------------------------

// handoffer performs a SIGUSR2 handoff for the first process.
type handoffer struct {
	log     *slog.Logger
	srv     *engine.Server
	adminLn net.Listener // the admin endpoint's listener (nil: none)
	procs   int          // --procs
	sup     *supervisor  // the siblings (nil without --procs): handed over too (prochandoff.go)
	stdout  *os.File
	stderr  *os.File
	busy    atomic.Bool
}

// start runs one handoff unless one is running; done gets true once the successor serves
// everything (the predecessor then stops), false if this process keeps serving.
func (h *handoffer) start(done chan<- bool) {
	if !h.busy.CompareAndSwap(false, true) {
		h.log.Warn("SIGUSR2 ignored: a handoff is already in progress")
		return
	}
	go func() {
		ok := h.run()
		if !ok {
			h.busy.Store(false)
		}
		done <- ok
	}()
}

func (h *handoffer) run() bool {
	began := time.Now()
	h.log.Info("SIGUSR2: starting a successor to hand everything over to")
	child, ctrl, exited, err := h.spawn()
	if err != nil {
		h.log.Error("handoff failed, still serving everything: cannot start the successor", "err", err)
		return false
	}
	var sibs []*handingSibling // the siblings asked to hand over too
	giveUp := func(why string, err error) bool {
		abortSiblings(sibs)
		_ = child.Process.Kill()
		_ = ctrl.Close()
		if e := waitExit(exited, 2*time.Second); e != nil && err == nil {
			err = e
		}
		h.log.Error("handoff failed, still serving everything: "+why, "successor", child.Process.Pid, "err", err)
		return false
	}
	_ = ctrl.SetReadDeadline(began.Add(readyTimeout()))
	nsib, why, err := readHello(ctrl)
	switch {
	case err != nil && why == "":
		return giveUp(h.whyNotReady(err, exited), err)
	case why != "":
		return giveUp(why, err)
	case nsib > 0 && h.sup == nil:
		return giveUp("the successor sent sockets for siblings this process does not have", nil)
	}
	// The successor's siblings' sockets, each forwarded to our sibling of the same slot.
	for range nsib {
		typ, body, fds, err := readFrame(ctrl)
		if err != nil || typ != 'P' || len(body) != 1 || len(fds) != 1 {
			closeFDs(fds)
			if err != nil {
				return giveUp(h.whyNotReady(err, exited), err)
			}
			return giveUp("the successor does not speak the handoff protocol", nil)
		}
		if hs := h.sup.forward(int(body[0]), fds[0]); hs != nil {
			sibs = append(sibs, hs)
		}
	}
	if h.procs > 1 && len(sibs) < h.procs-1 {
		h.log.Warn("handoff: not every sibling process is handed over; those that are not drain once this process is done (their clients resume from Last-Event-ID at the successor's processes)",
			"procs", h.procs, "handed_over", len(sibs))
	}
	// The successor LISTENs every raw channel we hold, and our mark's, before it says ready.
	rctx, rcancel := context.WithDeadline(context.Background(), began.Add(readyTimeout()))
	defer rcancel()
	mark, err := h.srv.BeginHandoff(rctx)
	if err != nil {
		h.srv.EndHandoff()
		return giveUp("cannot LISTEN the handoff mark's channel", err)
	}
	if err := sendChannels(rctx, h.srv, ctrl, mark); err != nil {
		h.srv.EndHandoff()
		if ne := net.Error(nil); errors.As(err, &ne) || errors.Is(err, io.EOF) {
			return giveUp(h.whyNotReady(err, exited), err)
		}
		return giveUp("the successor did not LISTEN our channels", err)
	}
	_ = ctrl.SetReadDeadline(time.Time{})
	// Every sibling's successor is ready too, or nobody moves.
	if slot, err := siblingsReady(sibs, began.Add(readyTimeout())); err != nil {
		h.srv.EndHandoff()
		return giveUp(fmt.Sprintf("the sibling process of slot %d could not hand over", slot), err)
	}

	// From here the successor takes over: we stop accepting (it accepts on the same sockets).
	h.srv.StopAcceptingAll()
	if h.adminLn != nil {
		_ = h.adminLn.Close() // the successor serves the admin endpoint on its own copy
	}
	// The siblings move their connections meanwhile, each to the successor's of its slot.
	var moving []*handingSibling
	for _, hs := range sibs {
		if h.sup.commit(hs) && hs.tell('G') == nil {
			moving = append(moving, hs)
		}
	}
	handed, adopted, tookOver := handOverAll(h.log, h.srv, ctrl, mark)
	if !tookOver {
		_ = child.Process.Kill()
		return false
	}
	// Our hub feeds the siblings' connections until they are handed over: we wait for them.
	wait := time.NewTimer(siblingHandoffWait)
	defer wait.Stop()
	siblings := 0
	for _, hs := range moving {
		select {
		case <-hs.gone:
			siblings++
		case <-wait.C:
			h.log.Warn("handoff: a sibling process did not finish handing over in time; it drains", "slot", hs.slot, "pid", hs.pid)
		}
	}
	handoffNotify("MAINPID="+strconv.Itoa(child.Process.Pid)+"\nREADY=1", h.log)
	h.log.Info("handed everything over to the successor; exiting", "successor", child.Process.Pid,
		"connections", handed, "adopted", adopted, "siblings", siblings, "took", time.Since(began).Round(time.Millisecond).String())
	return true
}

// readHello reads the successor's 'H': the handoff version it speaks, and how many sibling
// sockets ('P') follow (prochandoff.go). why says what is wrong with it; a read error alone
// leaves why empty.
func readHello(ctrl *net.UnixConn) (siblings int, why string, err error) {
	typ, body, fds, err := readFrame(ctrl)
	closeFDs(fds)
	switch {
	case err != nil:
		return 0, "", err
	case typ != 'H' || len(body) < 1 || len(body) > 2:
		return 0, "the successor does not speak the handoff protocol", nil
	case int(body[0]) != framing.HandoffVersion:
		return 0, fmt.Sprintf("the successor speaks handoff version %d, this binary %d", body[0], framing.HandoffVersion), nil
	case len(body) == 2:
		return int(body[1]), "", nil
	}
	return 0, "", nil
}

// handOverAll is the predecessor's side once it has stopped accepting (the first process's
// and a sibling's): the channels taken on meanwhile, the mark, 'A', the connections, 'D' and
// the successor's 'K'. tookOver is false if the successor went away before it took over
// (logged): this process then serves the connections it has, accepting no more.
func handOverAll(log *slog.Logger, srv *engine.Server, ctrl *net.UnixConn, mark string) (handed, adopted int, tookOver bool) {
	// The channels taken on since (by connections accepted before we stopped, by workers),
	// then the mark: every channel the successor LISTENs now counts from it exactly.
	mctx, mcancel := context.WithTimeout(context.Background(), handoffReadyTimeout)
	defer mcancel()
	var ph handoffPhases
	t0 := time.Now()
	defer func() {
		if tookOver {
			ph.log(log, handed)
		}
	}()
	if err := sendChannels(mctx, srv, ctrl, mark); err != nil {
		log.Error("handoff: the successor went away as it took over; serving the connections we have, accepting no more", "err", err)
		return 0, -1, false
	}
	_ = ctrl.SetReadDeadline(time.Time{})
	if err := srv.MarkHandoff(mctx, mark); err != nil {
		log.Warn("handoff: cannot notify the handoff mark; channel subscriptions are handed over without their positions (hub workers get one RESYNC)", "err", err)
	}
	if err := writeFrame(ctrl, 'A', nil, nil); err != nil {
		log.Error("handoff: the successor went away as it took over; serving the connections we have, accepting no more", "err", err)
		return 0, -1, false
	}
	ph.mark = time.Since(t0)
	ctx, cancel := context.WithTimeout(context.Background(), handoffMoveTimeout)
	defer cancel()
	t1 := time.Now()
	last := t1
	handed, err := srv.HandOver(ctx, func(batch []engine.HandedConn) error {
		ts := time.Now()
		ph.between += ts.Sub(last)
		body, fds := batchBody(batch)
		err := writeFrame(ctrl, 'B', body, fds)
		last = time.Now()
		ph.send += last.Sub(ts)
		ph.batches++
		return err
	})
	ph.move = time.Since(t1)
	t2 := time.Now()
	defer func() { ph.adopt = time.Since(t2) }()
	if err != nil {
		log.Error("handoff: not every connection could be handed over; the rest are drained here", "handed", handed, "err", err)
	}
	if err := writeFrame(ctrl, 'D', nil, nil); err != nil {
		log.Error("handoff: the successor went away while taking the connections", "handed", handed, "err", err)
		return handed, -1, true // the listeners are its; nothing is left for us to serve
	}
	_ = ctrl.SetReadDeadline(time.Now().Add(handoffMoveTimeout))
	typ, body, fds, err := readFrame(ctrl)
	closeFDs(fds)
	adopted = -1
	if err == nil && typ == 'K' && len(body) == 4 {
		adopted = int(bin.BigEndian.Uint32(body))
	}
	_ = ctrl.Close()
	return handed, adopted, true
}

// handoffPhases is where a predecessor's handOverAll spent its time, logged once the
// successor took over (bench/RESULTS.md, scenario 17: the handover's parts): mark — the
// channels taken on meanwhile, the mark and 'A'; move — engine.Server.HandOver, of which send
// is the writes of the 'B' frames (SCM_RIGHTS) and between the time from one send's end to
// the next one's start (the loop tasks that record the connections, and their waits behind
// the loop's delivery rounds); adopt — 'D' until the successor's 'K' (its loop taking the
// last batches, its presence registration).
type handoffPhases struct {
	mark, move, send, between, adopt time.Duration
	batches                          int
}

func (p *handoffPhases) log(log *slog.Logger, handed int) {
	ms := func(d time.Duration) string { return d.Round(100 * time.Microsecond).String() }
	log.Info("handoff: connections moved", "connections", handed, "batches", p.batches, "mark", ms(p.mark),
		"move", ms(p.move), "send", ms(p.send), "between_sends", ms(p.between), "adopt", ms(p.adopt))
}

// sendChannels sends the raw channels this process holds and its mark ('C'), and waits for
// the successor's ready ('R'), which it sends once it LISTENs them all.
func sendChannels(ctx context.Context, srv *engine.Server, ctrl *net.UnixConn, mark string) error {
	names, err := srv.ListenedChannels(ctx)
	if err != nil {
		return err
	}
	rec := framing.AppendHandoffChannels(nil, &framing.HandoffChannelList{Mark: mark, Names: names})
	if err := writeFrame(ctrl, 'C', rec, nil); err != nil {
		return err
	}
	if d, ok := ctx.Deadline(); ok {
		_ = ctrl.SetReadDeadline(d)
	}
	typ, _, fds, err := readFrame(ctrl)
	closeFDs(fds)
	switch {
	case err != nil:
		return err
	case typ != 'R':
		return errors.New("the successor sent " + strconv.QuoteRune(rune(typ)) + " where it should say ready")
	}
	return nil
}

// whyNotReady says why the successor did not get ready: it exited (with what), or the time.
func (h *handoffer) whyNotReady(err error, exited <-chan error) string {
	if e := waitExit(exited, 500*time.Millisecond); e != nil || errors.Is(err, io.EOF) {
		return "the successor exited before it was ready (" + exitText(e) + ")"
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return "the successor was not ready within " + readyTimeout().String()
	}
	return "lost the successor before it was ready"
}

func exitText(err error) string {
	if err == nil {
		return "status 0"
	}
	return err.Error()
}

// waitExit is the successor's exit within d, or nil.
func waitExit(exited <-chan error, d time.Duration) error {
	select {
	case err := <-exited:
		if err == nil {
			return errors.New("exit status 0")
		}
		return err
	case <-time.After(d):
		return nil
	}
}

func closeFDs(fds []int) {
	for _, fd := range fds {
		_ = unix.Close(fd)
	}
}

// spawn starts the successor: os.Executable with this process's arguments and environment,
// the control socket as descriptor 3; the listeners follow on it ('L').
func (h *handoffer) spawn() (*exec.Cmd, *net.UnixConn, <-chan error, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, nil, nil, err
	}
	sseFD, hubFD, err := h.srv.ListenerFDs()
	if err != nil {
		return nil, nil, nil, err
	}
	fds := []int{sseFD}
	defer func() { closeFDs(fds) }()
	m := handoffMarker{Version: framing.HandoffVersion, Parent: os.Getpid()}
	if h.sup != nil {
		m.Siblings = len(h.sup.slots)
	}
	if hubFD >= 0 {
		m.Hub = true
		fds = append(fds, hubFD)
	}
	if sc, ok := h.adminLn.(syscall.Conn); ok && h.adminLn != nil {
		fd, err := engine.DupFD(sc)
		if err != nil {
			return nil, nil, nil, fmt.Errorf("the admin listener: %w", err)
		}
		m.Admin = true
		fds = append(fds, fd)
	}
	// Close-on-exec set under ForkLock, as os/exec expects (SOCK_CLOEXEC is not on every
	// platform pgsse builds for): the successor gets its end through ExtraFiles only.
	syscall.ForkLock.RLock()
	pair, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM, 0)
	if err == nil {
		syscall.CloseOnExec(pair[0])
		syscall.CloseOnExec(pair[1])
	}
	syscall.ForkLock.RUnlock()
	if err != nil {
		return nil, nil, nil, err
	}
	theirs := os.NewFile(uintptr(pair[1]), "pgsse-handoff-successor")
	defer theirs.Close()
	ours := os.NewFile(uintptr(pair[0]), "pgsse-handoff")
	c, err := net.FileConn(ours)
	_ = ours.Close()
	if err != nil {
		return nil, nil, nil, err
	}
	ctrl := c.(*net.UnixConn)
	if err := writeFrame(ctrl, 'L', nil, fds); err != nil { // buffered until the successor reads it
		_ = ctrl.Close()
		return nil, nil, nil, err
	}
	marker, _ := json.Marshal(m)
	cmd := exec.Command(exe, os.Args[1:]...)
	cmd.Args[0] = os.Args[0]
	cmd.Env = append(withoutInternal(os.Environ()), handoffEnv+"="+string(marker))
	cmd.Stdout, cmd.Stderr = h.stdout, h.stderr
	cmd.ExtraFiles = []*os.File{theirs}
	if err := cmd.Start(); err != nil {
		_ = ctrl.Close()
		return nil, nil, nil, fmt.Errorf("%s: %w", exe, err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	return cmd, ctrl, exited, nil
}

// withoutInternal is env without the variables only pgsse itself sets.
func withoutInternal(env []string) []string {
	out := env[:0:0]
	for _, kv := range env {
		if strings.HasPrefix(kv, handoffEnv+"=") || strings.HasPrefix(kv, siblingEnv+"=") {
			continue
		}
		out = append(out, kv)
	}
	return out
}

// handoffNotify sends state to systemd ($NOTIFY_SOCKET; sd_notify(3)), if it listens: the
// standard library over a datagram socket, no libsystemd. With Type=notify the unit's main
// PID follows MAINPID= (NotifyAccess=main: the predecessor, still the main PID, says it).
func handoffNotify(state string, log *slog.Logger) {
	path := os.Getenv("NOTIFY_SOCKET")
	if path == "" {
		return
	}
	if strings.HasPrefix(path, "@") {
		path = "\x00" + path[1:]
	}
	c, err := net.DialUnix("unixgram", nil, &net.UnixAddr{Name: path, Net: "unixgram"})
	if err == nil {
		_, err = c.Write([]byte(state))
		_ = c.Close()
	}
	if err != nil {
		log.Warn("cannot notify systemd", "state", strings.ReplaceAll(state, "\n", " "), "err", err)
	}
}

// --- the successor --------------------------------------------------------------------------

// successor is this process's side of a handoff while it takes over.
type successor struct {
	m      *handoffMarker
	ctrl   *net.UnixConn
	accept chan struct{}
	admin  net.Listener // the inherited admin listener, or nil
}

// asSuccessor serves on the listeners a predecessor handed over (Config.Inherited) on the
// control socket fd (handoffCtrlFD; a successor's sibling: siblingHandoffFD) and says which
// handoff version it speaks, at once. A marker of another version is answered with ours and
// refused: the predecessor keeps serving. If the predecessor's siblings hand over too (the
// marker's Siblings, and this process has as many), the sockets its own siblings take over on
// follow the 'H' (prochandoff.go).
func (s *serveSetup) asSuccessor(fd int, m *handoffMarker) (*successor, error) {
	ctrl, err := unixConnFD(fd)
	if err != nil {
		return nil, fmt.Errorf("%s: descriptor %d: %v", handoffEnv, fd, err)
	}
	_ = os.Unsetenv(handoffEnv) // not for our --procs siblings, nor a successor of ours
	su := &successor{m: m, ctrl: ctrl, accept: make(chan struct{})}
	hello := []byte{framing.HandoffVersion}
	var theirs []int
	if m.Version == framing.HandoffVersion && m.Siblings > 0 && m.Siblings == s.procs-1 {
		if s.siblingHandoffs, theirs, err = siblingPairs(m.Siblings); err != nil {
			return nil, fmt.Errorf("%s: socket pairs for the siblings: %v", handoffEnv, err)
		}
		hello = append(hello, byte(m.Siblings))
	}
	err = writeFrame(ctrl, 'H', hello, nil)
	for i := 0; err == nil && i < len(theirs); i++ {
		err = writeFrame(ctrl, 'P', []byte{byte(i + 1)}, theirs[i:i+1])
	}
	closeFDs(theirs)
	if err != nil {
		return nil, fmt.Errorf("%s: cannot answer the predecessor: %v", handoffEnv, err)
	}
	if m.Version != framing.HandoffVersion {
		return nil, fmt.Errorf("%s: the predecessor speaks handoff version %d, this binary %d", handoffEnv, m.Version, framing.HandoffVersion)
	}
	// A first process's 'L' is there already; a sibling's comes once its predecessor is told.
	_ = ctrl.SetReadDeadline(time.Now().Add(readyTimeout()))
	defer ctrl.SetReadDeadline(time.Time{})
	typ, _, fds, err := readFrame(ctrl)
	want := 1
	if m.Hub {
		want++
	}
	if m.Admin {
		want++
	}
	if err != nil || typ != 'L' || len(fds) != want {
		closeFDs(fds)
		return nil, fmt.Errorf("%s: the predecessor's listeners did not arrive (%d of %d): %v", handoffEnv, len(fds), want, err)
	}
	inh := &engine.Inheritance{Accept: su.accept}
	if inh.SSE, err = listenerFD(fds[0]); err != nil {
		closeFDs(fds[1:])
		return nil, fmt.Errorf("%s: --listen: %v", handoffEnv, err)
	}
	next := 1
	if m.Hub {
		if inh.Hub, err = listenerFD(fds[next]); err != nil {
			return nil, fmt.Errorf("%s: --hub-socket: %v", handoffEnv, err)
		}
		next++
	}
	if m.Admin {
		if su.admin, err = listenerFD(fds[next]); err != nil {
			return nil, fmt.Errorf("%s: --admin-listen: %v", handoffEnv, err)
		}
	}
	s.cfg.Inherited = inh
	return su, nil
}

// takeOver runs once the engine has started: ready once the LISTEN session is up, then it
// takes what the predecessor hands over. giveUp runs if the predecessor went away before it
// let go (it keeps serving: this process stops).
func (su *successor) takeOver(srv *engine.Server, log *slog.Logger, giveUp func()) {
	defer su.ctrl.Close()
	deadline := time.Now().Add(handoffReadyTimeout)
	for !srv.Ready() {
		if time.Now().After(deadline) {
			log.Error("handoff: not ready in time (LISTEN session or schema); the predecessor keeps serving", "reason", srv.NotReadyReason())
			giveUp()
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	accepting, ready := false, false
	adopted := 0
	win := adoptWindow{max: handoffAdopting, log: log}
	settle := win.settle
	for {
		typ, body, fds, err := readFrame(su.ctrl)
		if err != nil {
			if !accepting {
				log.Info("handoff: the predecessor kept serving; stopping", "err", err)
				giveUp()
				return
			}
			log.Error("handoff: the predecessor went away while handing over; serving what arrived", "adopted", adopted, "err", err)
			settle()
			su.takeOverPresence(srv, log)
			return
		}
		switch typ {
		case 'C':
			// The first time, a failure leaves the predecessor serving; once it has stopped
			// accepting (the second time), this process takes over whatever happens.
			if err := su.hold(srv, body, time.Now().Add(handoffReadyTimeout)); err != nil {
				if !ready {
					log.Error("handoff: cannot LISTEN the predecessor's channels; the predecessor keeps serving", "err", err)
					giveUp()
					return
				}
				log.Error("handoff: cannot LISTEN some of the predecessor's channels; their subscriptions resume without their positions", "err", err)
			}
			if err := writeFrame(su.ctrl, 'R', nil, nil); err != nil && !ready {
				log.Error("handoff: the predecessor went away; stopping", "err", err)
				giveUp()
				return
			}
			ready = true
		case 'A':
			if !accepting {
				accepting = true
				close(su.accept)
			}
		case 'B':
			recs, err := parseBatch(body, len(fds))
			if err != nil {
				closeFDs(fds)
				log.Error("handoff: a bad batch; its connections are closed", "err", err)
				continue
			}
			// The next batch is read while the loop takes this one (engine.AdoptAsync), as
			// long as at most handoffAdopting connections are on their way.
			win.add(len(fds), func() <-chan error { return srv.AdoptAsync(fds, recs) })
			adopted += len(fds)
		case 'D':
			settle()
			srv.ReleaseHeldChannels()     // the adopted connections hold their channels themselves
			su.takeOverPresence(srv, log) // before 'K': the predecessor then exits
			_ = writeFrame(su.ctrl, 'K', bin.BigEndian.AppendUint32(nil, uint32(adopted)), nil)
			log.Info("handoff complete: serving everything the predecessor served", "pid", os.Getpid(), "adopted", adopted)
			return
		default:
			closeFDs(fds)
		}
	}
}

// adoptWindow bounds the connections a successor has received but its loop has not taken
// yet (handoffAdopting: each holds two descriptors meanwhile).
type adoptWindow struct {
	max      int
	log      *slog.Logger
	batches  []adoptBatch // on their way to the loop, oldest first
	inFlight int          // their connections
}

type adoptBatch struct {
	res <-chan error // engine.AdoptAsync's
	n   int
}

// add starts a batch of n connections on its way to the loop (adopt: engine.AdoptAsync),
// first waiting for the oldest ones to be on it while n more would make over max on their
// way (a batch is never refused: one over max alone goes when nothing else is on its way).
func (w *adoptWindow) add(n int, adopt func() <-chan error) {
	for len(w.batches) > 0 && w.inFlight+n > w.max {
		w.settleOne()
	}
	w.batches = append(w.batches, adoptBatch{adopt(), n})
	w.inFlight += n
}

// settleOne waits for the oldest batch to be on the loop.
func (w *adoptWindow) settleOne() {
	b := w.batches[0]
	w.batches = w.batches[1:]
	w.inFlight -= b.n
	if err := <-b.res; err != nil {
		w.log.Error("handoff: connections that could not be taken over were closed", "err", err)
	}
}

// settle waits for every batch to be on the loop.
func (w *adoptWindow) settle() {
	for len(w.batches) > 0 {
		w.settleOne()
	}
}

// handoffPresenceWait bounds how long a successor waits for its presence registration
// (engine.Server.TakeOverPresence) before it tells the predecessor it serves ('K'): the
// predecessor, which does not retire its entries, renews them until it exits, and they lapse
// two intervals later — a registration that carries a large state takes seconds (100,000
// counts: 11 s on the 2-core VM under load, bench scenario 13). Within the predecessor's 30 s
// wait for 'K' (handoffMoveTimeout).
const handoffPresenceWait = 20 * time.Second

// takeOverPresence lets the engine register this process's presence, which replaces the
// predecessor's entries with the adopted connections' counts, and waits for it (bounded).
func (su *successor) takeOverPresence(srv *engine.Server, log *slog.Logger) {
	ctx, cancel := context.WithTimeout(context.Background(), handoffPresenceWait)
	defer cancel()
	if err := srv.TakeOverPresence(ctx); err != nil {
		log.Warn("handoff: presence is not registered yet; the moved connections' presence follows with its first write", "err", err)
	}
}

// hold LISTENs the channels of a 'C' record (engine.Server.HoldChannels) before deadline.
func (su *successor) hold(srv *engine.Server, body []byte, deadline time.Time) error {
	rec, err := framing.DecodeHandoff(body)
	if err != nil {
		return err
	}
	if rec.Kind != framing.HandoffChannels {
		return fmt.Errorf("handoff: a record of kind %d where the channels should be", rec.Kind)
	}
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	return srv.HoldChannels(ctx, rec.Channels.Mark, rec.Channels.Names)
}

func unixConnFD(fd int) (*net.UnixConn, error) {
	f := os.NewFile(uintptr(fd), "pgsse-handoff")
	if f == nil {
		return nil, errors.New("not open")
	}
	c, err := net.FileConn(f)
	_ = f.Close()
	if err != nil {
		return nil, err
	}
	uc, ok := c.(*net.UnixConn)
	if !ok {
		_ = c.Close()
		return nil, errors.New("not a Unix socket")
	}
	return uc, nil
}

func listenerFD(fd int) (net.Listener, error) {
	f := os.NewFile(uintptr(fd), "pgsse-inherited-listener")
	if f == nil {
		return nil, errors.New("not open")
	}
	ln, err := net.FileListener(f)
	_ = f.Close()
	return ln, err
}
