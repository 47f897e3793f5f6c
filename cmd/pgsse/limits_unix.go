//go:build unix

package main

import "syscall"

// fdLimit is the soft RLIMIT_NOFILE (the Go runtime has already raised it to the hard
// limit at start-up), or 0 if it cannot be read.
func fdLimit() uint64 {
	var rl syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil {
		return 0
	}
	return rl.Cur
}
