//go:build !unix

package main

import "os/exec"

// detach has nothing to do without process groups.
func detach(*exec.Cmd) {}

// terminate stops the server at once: there is no SIGTERM to send.
func terminate(cmd *exec.Cmd) { _ = cmd.Process.Kill() }

// killGroup kills the server.
func killGroup(cmd *exec.Cmd) { _ = cmd.Process.Kill() }
