package servetest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"syscall"
	"time"
)

// Output collects what one or more processes write (stdout and stderr alike) and tells
// whoever waits for a line that more has come: a log line is a signal, not something to
// poll for. Optionally it is copied to a file as well.
type Output struct {
	mu      sync.Mutex
	buf     []byte
	changed chan struct{} // closed and replaced at every write
	file    *os.File
}

// NewOutput is an Output that also appends to file (when not "").
func NewOutput(file string) (*Output, error) {
	o := &Output{changed: make(chan struct{})}
	if file != "" {
		f, err := os.OpenFile(file, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
		if err != nil {
			return nil, err
		}
		o.file = f
	}
	return o, nil
}

func (o *Output) Write(p []byte) (int, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.buf = append(o.buf, p...)
	if o.file != nil {
		_, _ = o.file.Write(p)
	}
	close(o.changed)
	o.changed = make(chan struct{})
	return len(p), nil
}

// Printf writes a line of the harness's own (a start or an exit) into the output.
func (o *Output) Printf(format string, args ...any) {
	fmt.Fprintf(o, "---- "+format+"\n", args...)
}

// String is everything written so far.
func (o *Output) String() string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return string(o.buf)
}

// Len is how much has been written so far (an offset for WaitLine).
func (o *Output) Len() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return len(o.buf)
}

// Close closes the file copy.
func (o *Output) Close() error {
	if o.file == nil {
		return nil
	}
	return o.file.Close()
}

// snapshot returns the bytes from offset on and the channel that the next write closes.
func (o *Output) snapshot(from int) ([]byte, chan struct{}) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.buf[from:len(o.buf):len(o.buf)], o.changed
}

// ProcessOptions say how to start a server process.
type ProcessOptions struct {
	Path string
	Args []string
	Env  []string // the whole environment (nil: this process's)
	Dir  string
	// NoFile sets the process's RLIMIT_NOFILE soft limit (through `sh -c 'ulimit -n N; exec …'`;
	// the pid is still the server's). 0 leaves the test's own.
	NoFile int
	// Output receives the process's stdout and stderr (nil: a new one of its own).
	Output *Output
	// DieWithParent: the process gets SIGKILL if this one dies (bench/: never leave a server
	// running) and a process group of its own.
	DieWithParent bool
}

// Process is a running server process. Its output goes through a pipe that the process and
// any children it starts (--procs siblings) share; cmd.Wait does not wait for them.
type Process struct {
	Out *Output

	cmd      *exec.Cmd
	start    int           // where this process's output begins in Out
	exited   chan struct{} // closed once the process has exited (cmd.Wait returned)
	waitErr  error
	read     *os.File
	readDone chan struct{} // closed once every writer of the pipe has closed it
}

// StartProcess starts o.Path.
func StartProcess(o ProcessOptions) (*Process, error) {
	out := o.Output
	if out == nil {
		var err error
		if out, err = NewOutput(""); err != nil {
			return nil, err
		}
	}
	path, args := o.Path, o.Args
	if o.NoFile > 0 {
		args = append([]string{"-c", "ulimit -n " + strconv.Itoa(o.NoFile) + ` && exec "$0" "$@"`, path}, args...)
		path = "/bin/sh"
	}
	r, w, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(path, args...)
	cmd.Env, cmd.Dir = o.Env, o.Dir
	cmd.Stdout, cmd.Stderr = w, w // an *os.File: no copying goroutine for Wait to wait for
	if o.DieWithParent {
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
	}
	p := &Process{Out: out, cmd: cmd, start: out.Len(), exited: make(chan struct{}), read: r, readDone: make(chan struct{})}
	if err := cmd.Start(); err != nil {
		r.Close()
		w.Close()
		return nil, fmt.Errorf("start %s: %w", o.Path, err)
	}
	w.Close() // the children hold it now
	go func() {
		defer close(p.readDone)
		_, _ = io.Copy(out, r)
	}()
	go func() {
		p.waitErr = cmd.Wait()
		close(p.exited)
	}()
	return p, nil
}

// PID is the process id.
func (p *Process) PID() int { return p.cmd.Process.Pid }

// Exited is closed once the process has exited.
func (p *Process) Exited() <-chan struct{} { return p.exited }

// ExitErr is how the process ended (nil: status 0); call it after Exited.
func (p *Process) ExitErr() error {
	<-p.exited
	return p.waitErr
}

// State is the process's exit state, nil while it runs.
func (p *Process) State() *os.ProcessState {
	select {
	case <-p.exited:
		return p.cmd.ProcessState
	default:
		return nil
	}
}

// Signal sends sig to the process.
func (p *Process) Signal(sig os.Signal) error { return p.cmd.Process.Signal(sig) }

// Stop sends SIGTERM and waits for the exit; after grace, SIGKILL. It reports whether the
// process had to be killed.
func (p *Process) Stop(grace time.Duration) (killed bool) {
	select {
	case <-p.exited:
		return false
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.exited:
		return false
	case <-time.After(grace):
		_ = p.cmd.Process.Kill()
		<-p.exited
		return true
	}
}

// Kill sends SIGKILL and waits for the exit.
func (p *Process) Kill() {
	_ = p.cmd.Process.Kill()
	<-p.exited
}

// CloseOutput stops reading the output: at once if every writer has closed the pipe, else
// after wait (a child that outlived the process, say). Call it when done with the process.
func (p *Process) CloseOutput(wait time.Duration) {
	select {
	case <-p.readDone:
	case <-time.After(wait):
	}
	p.read.Close()
	<-p.readDone
}

// Output is what this process (and its children) wrote.
func (p *Process) Output() string { return p.Out.String()[p.start:] }

// ErrEnded: the process and every child holding its output are gone, and no line matched.
var ErrEnded = errors.New("the process ended")

// WaitLine waits until a complete line of this process's output satisfies match, and
// returns it. It wakes on every write rather than polling; it gives up when ctx ends or when
// the output ends (ErrEnded: the process exited and no child holds the pipe).
func (p *Process) WaitLine(ctx context.Context, match func(line []byte) bool) ([]byte, error) {
	scanned := p.start
	for {
		// Read readDone before the snapshot: if the output had ended, the snapshot is all of it.
		ended := false
		select {
		case <-p.readDone:
			ended = true
		default:
		}
		b, changed := p.Out.snapshot(scanned)
		for {
			i := bytes.IndexByte(b, '\n')
			if i < 0 {
				break
			}
			line := b[:i]
			b = b[i+1:]
			scanned += i + 1
			if match(line) {
				return bytes.Clone(line), nil
			}
		}
		if ended {
			return nil, ErrEnded
		}
		select {
		case <-changed:
		case <-p.readDone:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// Poll calls probe until it succeeds (nil), the process exits (ErrEnded) or ctx ends
// (probe's last error). For what no line announces — an HTTP answer: /readyz, a stream.
func (p *Process) Poll(ctx context.Context, every time.Duration, probe func() error) error {
	for {
		err := probe()
		if err == nil {
			return nil
		}
		select {
		case <-p.exited:
			return fmt.Errorf("%w (%v) while waiting: %v", ErrEnded, p.waitErr, err)
		case <-ctx.Done():
			return fmt.Errorf("%w; last: %v", ctx.Err(), err)
		case <-time.After(every): // polling: see above
		}
	}
}

// Gone reports whether pid has exited (no such process, or a zombie nobody reaped).
func Gone(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return true
	}
	// "pid (comm) S ...": the state follows the last ')'.
	i := bytes.LastIndexByte(b, ')')
	return i < 0 || i+2 >= len(b) || b[i+2] == 'Z' || b[i+2] == 'X'
}
