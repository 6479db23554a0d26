//go:build unix

package main

import (
	"os/exec"
	"syscall"
)

// detach puts the server in a process group of its own, so that a Ctrl-C at the terminal
// reaches the bench only, which then stops the server itself; on Linux the kernel also kills
// the server if the bench dies first.
func detach(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	dieWithParent(cmd.SysProcAttr)
}

// terminate asks the server to shut down gracefully (SIGTERM).
func terminate(cmd *exec.Cmd) { _ = cmd.Process.Signal(syscall.SIGTERM) }

// killGroup kills the server's process group.
func killGroup(cmd *exec.Cmd) { _ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
