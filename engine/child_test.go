package engine_test

import (
	"io"
	"testing"

	"github.com/strictrate/strictrate/internal/valkeytest"
)

// child is this test binary run again as an OS process of its own (valkeytest.Rerun), for one
// test alone, on the example server; the test tells it what to do through its environment.
// It is stopped when the test ends, if it has not exited.
type child struct {
	*valkeytest.Process
	Stdout io.Reader // what it prints; read it to its end before Wait
}

// startChild starts the test named test as a child process, with env (NAME=value) added.
func startChild(t *testing.T, test string, env ...string) *child {
	t.Helper()
	p, stdout := valkeytest.Rerun(t, test, append(env, valkeytest.EnvAddr+"="+exampleServer.Addr)...)
	return &child{Process: p, Stdout: stdout}
}

// Wait waits for the child to exit, once its Stdout is read to the end, and returns how it
// ended (what it wrote to stderr is in the test's output).
func (c *child) Wait() error {
	<-c.Done()
	return c.Err()
}
