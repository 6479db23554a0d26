package valkeytest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// A process dies with its parent: the grandchild, in a process group of its own and deaf to
// SIGTERM, is killed by the kernel when its parent is killed with SIGKILL (which runs no
// cleanup of the parent's).
func TestProcessDiesWithItsParent(t *testing.T) {
	parent, out := Rerun(t, "TestProcessChild", childRoleEnv+"=parent")
	pid, err := strconv.Atoi(waitLine(t, out, "grandchild "))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = syscall.Kill(pid, syscall.SIGKILL) }) // should the test fail
	if err := parent.Kill(); err != nil {
		t.Fatal(err)
	}
	err = WaitFor(context.Background(), time.Minute, "the grandchild's end", func() (bool, error) {
		return !running(pid), nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// running reports whether process pid exists and is not a zombie (dead, waiting to be reaped
// by whoever adopted it).
func running(pid int) bool {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if errors.Is(err, os.ErrNotExist) {
		return false
	}
	// The state is the field after the command's name, in parentheses.
	_, after, _ := strings.Cut(string(stat), ") ")
	return !strings.HasPrefix(after, "Z") && !strings.HasPrefix(after, "X")
}
