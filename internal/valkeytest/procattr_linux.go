package valkeytest

import "syscall"

// dieWithParent asks the kernel to kill the server if the test process dies first, so a
// crashed or killed test run leaves no server behind.
func dieWithParent(a *syscall.SysProcAttr) { a.Pdeathsig = syscall.SIGKILL }
