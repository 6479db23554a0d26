//go:build unix

package valkeytest

import (
	"errors"
	"syscall"
)

// Pause stops a server that Start launched from a binary (SIGSTOP), as a machine that stops
// answering does: its connections stay open, and what its clients send waits, unanswered,
// until Resume (SIGCONT), when the server takes it. It fails for a server Start did not
// launch. Resume it before the test ends (t.Cleanup): a stopped process takes no SIGTERM.
func (s *Server) Pause() error { return s.signal(syscall.SIGSTOP) }

// Resume lets a paused server run again (SIGCONT).
func (s *Server) Resume() error { return s.signal(syscall.SIGCONT) }

func (s *Server) signal(sig syscall.Signal) error {
	if s.proc == nil || s.proc.run == nil {
		return errors.New("valkeytest: Pause and Resume need a server launched by Start (use OwnServer)")
	}
	return s.proc.run.Signal(sig)
}
