//go:build !linux

package faults

import "syscall"

// setParentDeathSignal: only Linux can tie a child's life to its parent's.
func setParentDeathSignal(*syscall.SysProcAttr) {}
