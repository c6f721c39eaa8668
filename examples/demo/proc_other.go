//go:build !linux

package main

import "syscall"

// dieWithParent is Linux-only (Pdeathsig); elsewhere a demo killed with
// SIGKILL leaves its children to be stopped by hand.
func dieWithParent(*syscall.SysProcAttr) {}
