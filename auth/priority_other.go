//go:build !linux

package auth

// Elsewhere than on Linux a thread has no nice value of its own: the verifier goroutines run
// at the process's priority (PoolConfig.Nice is reported through OnPriorityError).

const threadPrioritySupported = false

func lowerThreadPriority(int) error { return errNoThreadPriority }

func isMainThread() bool { return false }
