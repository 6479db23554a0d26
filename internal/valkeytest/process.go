package valkeytest

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// The one way strictrate's tests and benches run a program of their own (valkey-server, the
// rate limit service, the reference's binary, the test binary again): StartProcess for a
// bench or a server that outlives one test, NewProcess in a test, Rerun for a test played
// by a child process. On Linux the process gets a process group of its own, so that a Ctrl-C
// at the terminal reaches the parent alone, which stops it, and the kernel kills it when the
// parent dies first (killed, or crashed), so that none outlives its run. Elsewhere it stays
// in the parent's group: without a parent-death signal, the terminal's Ctrl-C is what stops
// it when the parent cannot.

// cleanupStop is how long a process NewProcess or Rerun started gets to exit after SIGTERM
// at the end of its test before it is killed.
const cleanupStop = 10 * time.Second

// Process is a program started by StartProcess, NewProcess or Rerun. Stop ends it gracefully,
// Kill at once; Done, Err and ExitCode say when and how it ended.
type Process struct {
	name string // the binary's base name, for messages
	cmd  *exec.Cmd
	done chan struct{} // closed when the process has exited and its output is copied
	err  error         // cmd.Wait's error; written before done is closed
}

// StartProcess starts bin with args and returns without waiting for it to do anything. env is
// its whole environment (NAME=value); nil passes this process's on. What it writes to
// standard output and standard error goes to output; nil discards it. The caller must stop
// it (Stop or Kill), or let it exit.
func StartProcess(bin string, args, env []string, output io.Writer) (*Process, error) {
	return startProcess(bin, args, env, output, output)
}

// NewProcess is StartProcess for a test: it fails tb if bin cannot start, and stops the
// process (Stop) when the test ends, failing tb if it has to be killed.
func NewProcess(tb testing.TB, bin string, args, env []string, output io.Writer) *Process {
	tb.Helper()
	p, err := StartProcess(bin, args, env, output)
	if err != nil {
		tb.Fatal(err)
	}
	stopAtCleanup(tb, p)
	return p
}

// Rerun starts the running test binary again, as a process of its own, for the test named
// test alone, once; env (NAME=value) is added to this process's environment, and tells the
// test it plays the child's part. It returns the process and its standard output, which ends
// when the process has exited: read it to its end, or not at all (the child then blocks on a
// full pipe until it is stopped). Its standard error is this process's. The process is
// stopped (Stop) when tb's test ends.
func Rerun(tb testing.TB, test string, env ...string) (*Process, io.Reader) {
	tb.Helper()
	bin, err := os.Executable()
	if err != nil {
		tb.Fatalf("valkeytest: the test binary: %v", err)
	}
	r, w, err := os.Pipe()
	if err != nil {
		tb.Fatalf("valkeytest: pipe: %v", err)
	}
	p, err := startProcess(bin, []string{"-test.run=^" + test + "$", "-test.count=1"},
		append(os.Environ(), env...), w, os.Stderr)
	w.Close() // the child holds its own copy: r ends when the child has exited
	if err != nil {
		r.Close()
		tb.Fatal(err)
	}
	tb.Cleanup(func() { r.Close() }) // after the stop below: cleanups run last first
	stopAtCleanup(tb, p)
	return p, r
}

func startProcess(bin string, args, env []string, stdout, stderr io.Writer) (*Process, error) {
	cmd := exec.Command(bin, args...)
	cmd.Env = env
	cmd.Stdout, cmd.Stderr = stdout, stderr
	detach(cmd)
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("valkeytest: start %s: %w", bin, err)
	}
	p := &Process{name: filepath.Base(bin), cmd: cmd, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	return p, nil
}

// stopAtCleanup stops p when tb's test ends, unless it has exited.
func stopAtCleanup(tb testing.TB, p *Process) {
	tb.Cleanup(func() {
		if err := p.Stop(cleanupStop); err != nil {
			tb.Error(err)
		}
	})
}

// Pid is the process's id.
func (p *Process) Pid() int { return p.cmd.Process.Pid }

// Done is closed when the process has exited (and what it wrote is copied to its output).
func (p *Process) Done() <-chan struct{} { return p.done }

// exited reports whether Done is closed.
func (p *Process) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// Err says how the process ended: nil for exit code 0, else the *exec.ExitError ("exit
// status 1", "signal: killed"). It is nil while the process runs.
func (p *Process) Err() error {
	if !p.exited() {
		return nil
	}
	return p.err
}

// ExitCode is the process's exit code, -1 while it runs or when a signal ended it.
func (p *Process) ExitCode() int {
	if !p.exited() {
		return -1
	}
	return p.cmd.ProcessState.ExitCode()
}

// Signal sends sig to the process alone: SIGTERM as Kubernetes stops a pod, SIGSTOP and
// SIGCONT to pause it.
func (p *Process) Signal(sig os.Signal) error {
	if err := p.cmd.Process.Signal(sig); err != nil {
		return fmt.Errorf("valkeytest: signal %s: %w", p.name, err)
	}
	return nil
}

// Stop asks the process to exit (SIGTERM; where there are no signals, it kills it), waits up
// to limit for it to, and kills it (Kill) if it has not. It returns an error only when the
// process had to be killed; Err and ExitCode say how it ended. Stopping a process that has
// exited does nothing.
func (p *Process) Stop(limit time.Duration) error {
	if p.exited() {
		return nil
	}
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		return p.Kill()
	}
	return p.killAfter(limit, " of SIGTERM")
}

// Wait waits up to limit for the process to exit by itself, and kills it (Kill) if it has
// not. It returns an error only when the process had to be killed; Err and ExitCode say how
// it ended.
func (p *Process) Wait(limit time.Duration) error { return p.killAfter(limit, "") }

// killAfter waits up to limit for the process to exit, and kills it if it has not: then it
// returns an error that says so, with since, what the limit counted from.
func (p *Process) killAfter(limit time.Duration, since string) error {
	timer := time.NewTimer(limit)
	defer timer.Stop()
	select {
	case <-p.done:
		return nil
	case <-timer.C:
	}
	if err := p.Kill(); err != nil {
		return err
	}
	return fmt.Errorf("valkeytest: %s did not exit within %v%s: killed", p.name, limit, since)
}

// Kill kills the process at once (SIGKILL; on Linux its whole process group), as a crash or
// kill -9 does: nothing of its own runs. It returns once the process has exited, or with an
// error if it could not be killed.
func (p *Process) Kill() error {
	if p.exited() {
		return nil
	}
	if killGroup(p.cmd.Process) != nil {
		if err := p.cmd.Process.Kill(); err != nil && !errors.Is(err, os.ErrProcessDone) {
			return fmt.Errorf("valkeytest: kill %s: %w", p.name, err)
		}
	}
	<-p.done
	return nil
}
