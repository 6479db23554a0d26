//go:build !linux

package valkeytest

import (
	"os"
	"os/exec"
)

// detach leaves the process in the parent's process group: without a parent-death signal, a
// Ctrl-C at the terminal, which may kill the parent before it stops the process, must reach
// the process too.
func detach(*exec.Cmd) {}

// killGroup kills the process: it has no group of its own.
func killGroup(p *os.Process) error { return p.Kill() }
