package engine_test

import (
	"io"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/strictrate/strictrate/internal/valkeytest"
)

// child is this test binary run again as an OS process of its own, for one test alone, on the
// example server; the test tells it what to do through its environment.
type child struct {
	cmd    *exec.Cmd
	Stdout io.Reader // what it prints; read it to its end before Wait
	stderr *strings.Builder
}

// startChild starts the test named test as a child process, with env (NAME=value) added.
func startChild(t *testing.T, test string, env ...string) *child {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^"+test+"$", "-test.count=1")
	cmd.Env = append(append(os.Environ(), env...), valkeytest.EnvAddr+"="+exampleServer.Addr)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	c := &child{cmd: cmd, Stdout: out, stderr: new(strings.Builder)}
	cmd.Stderr = c.stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	return c
}

// Wait waits for the child to exit, once its Stdout is read to the end, and returns how it
// ended, with what it wrote to stderr when it failed.
func (c *child) Wait() error {
	if err := c.cmd.Wait(); err != nil {
		return &childError{err: err, stderr: c.stderr.String()}
	}
	return nil
}

// Kill ends the child at once (SIGKILL).
func (c *child) Kill() error { return c.cmd.Process.Kill() }

// childError is a child's failure and its stderr.
type childError struct {
	err    error
	stderr string
}

func (e *childError) Error() string { return e.err.Error() + "\n" + e.stderr }
func (e *childError) Unwrap() error { return e.err }
