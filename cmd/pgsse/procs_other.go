//go:build !linux

package main

import (
	"errors"
	"syscall"
)

// procsSupported: elsewhere SO_REUSEPORT does not spread connections over the processes (BSD
// and macOS hand them all to one) and there is no parent-death signal: --procs stays 1.
const procsSupported = false

func siblingSocketpair() ([2]int, error) { return [2]int{}, errors.ErrUnsupported }

func siblingProcAttr() *syscall.SysProcAttr { return &syscall.SysProcAttr{Setpgid: true} }
