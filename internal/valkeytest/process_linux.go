package valkeytest

import (
	"os"
	"os/exec"
	"syscall"
)

// detach puts the process in a process group of its own, so that a Ctrl-C at the terminal
// reaches the parent alone, and asks the kernel to kill it if the parent dies first.
func detach(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}

// killGroup kills the process's group: the process and whatever it started.
func killGroup(p *os.Process) error { return syscall.Kill(-p.Pid, syscall.SIGKILL) }
