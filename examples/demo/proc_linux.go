package main

import "syscall"

// dieWithParent asks the kernel to send SIGTERM to the child if the demo
// dies without stopping it (SIGKILL, a crash), so no hopper or demoapp is
// left running against a broker that is gone.
func dieWithParent(attr *syscall.SysProcAttr) {
	attr.Pdeathsig = syscall.SIGTERM
}
