//go:build linux

package auth

import "golang.org/x/sys/unix"

// lowerThreadPriority raises the nice value of the calling goroutine's thread by delta (to at
// most 19), leaving every other thread of the process as it was. The caller has locked the
// goroutine to its thread (runtime.LockOSThread) and never unlocks: when it returns still
// locked, the runtime ends the thread, so no other goroutine ever runs at the lowered
// priority.
func lowerThreadPriority(delta int) error {
	tid := unix.Gettid()
	raw, err := unix.Getpriority(unix.PRIO_PROCESS, tid) // the system call answers 20 − nice
	if err != nil {
		return err
	}
	return unix.Setpriority(unix.PRIO_PROCESS, tid, min(20-raw+delta, 19))
}

// isMainThread: the calling goroutine runs on the process's main thread (whose thread id is
// the process id).
func isMainThread() bool { return unix.Gettid() == unix.Getpid() }

// threadPrioritySupported: lowerThreadPriority works here.
const threadPrioritySupported = true
