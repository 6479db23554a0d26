//go:build unix && !linux

package main

import "syscall"

// dieWithParent has no equivalent outside Linux: a bench killed with SIGKILL leaves its
// servers running there.
func dieWithParent(*syscall.SysProcAttr) {}
