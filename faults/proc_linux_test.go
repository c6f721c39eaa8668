package faults

import "syscall"

// setParentDeathSignal makes the kernel SIGKILL a hopper subprocess if the
// test binary dies without cleaning up (panic, -timeout, ^C).
func setParentDeathSignal(attr *syscall.SysProcAttr) { attr.Pdeathsig = syscall.SIGKILL }
