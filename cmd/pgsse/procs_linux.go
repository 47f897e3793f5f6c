package main

import "syscall"

// procsSupported: --procs above 1 works here (SO_REUSEPORT spreads connections, the
// parent-death signal exists).
const procsSupported = true

// siblingSocketpair is the pair of connected sockets between the first process and a sibling.
func siblingSocketpair() ([2]int, error) {
	return syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
}

// siblingProcAttr: a sibling runs in its own process group (a terminal's Ctrl-C reaches only
// the first process, which stops the siblings in order) and gets parentDeathSignal when the
// first process dies.
func siblingProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: parentDeathSignal}
}
