//go:build !linux

package valkeytest

import "syscall"

// dieWithParent does nothing where the kernel has no parent-death signal; Close still stops
// the server.
func dieWithParent(*syscall.SysProcAttr) {}
