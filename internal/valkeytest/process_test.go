package valkeytest

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"testing"
	"time"
)

// childRoleEnv tells TestProcessChild which child to play.
const childRoleEnv = "STRICTRATE_VALKEYTEST_CHILD"

// TestProcessChild is not a test: run again by the Process tests (Rerun), it plays the child
// its environment names, and says "ready" once it is in place.
//   - graceful: exits 0 on SIGTERM;
//   - stubborn: ignores SIGTERM;
//   - parent: starts a stubborn child of its own, says "grandchild PID", and ignores SIGTERM.
func TestProcessChild(t *testing.T) {
	role := os.Getenv(childRoleEnv)
	if role == "" {
		t.Skip("a child process of the Process tests")
	}
	terms := make(chan os.Signal, 1)
	signal.Notify(terms, syscall.SIGTERM)
	switch role {
	case "graceful":
		fmt.Println("ready")
		<-terms
	case "stubborn":
		fmt.Println("ready")
		for range terms {
		}
	case "parent":
		grandchild, out := Rerun(t, "TestProcessChild", childRoleEnv+"=stubborn")
		waitLine(t, out, "ready")
		fmt.Printf("grandchild %d\n", grandchild.Pid())
		for range terms {
		}
	}
}

// waitLine reads r until a line that starts with prefix, and returns the rest of that line.
func waitLine(t *testing.T, r io.Reader, prefix string) string {
	t.Helper()
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), prefix); ok {
			return strings.TrimSpace(rest)
		}
	}
	t.Fatalf("the child ended without a line %q: %v", prefix, sc.Err())
	return ""
}

// A process that exits on SIGTERM is stopped by it, with exit code 0.
func TestProcessStopsOnSIGTERM(t *testing.T) {
	p, out := Rerun(t, "TestProcessChild", childRoleEnv+"=graceful")
	waitLine(t, out, "ready")
	if err := p.Stop(time.Minute); err != nil {
		t.Fatal(err)
	}
	if p.Err() != nil || p.ExitCode() != 0 {
		t.Fatalf("the child ended with %v (exit code %d), want exit code 0", p.Err(), p.ExitCode())
	}
}

// A process that ignores SIGTERM is killed when Stop's limit has passed, and Stop says so.
func TestProcessStopKillsWhatIgnoresSIGTERM(t *testing.T) {
	p, out := Rerun(t, "TestProcessChild", childRoleEnv+"=stubborn")
	waitLine(t, out, "ready")
	err := p.Stop(100 * time.Millisecond)
	if err == nil || !strings.Contains(err.Error(), "killed") {
		t.Fatalf("Stop of a process that ignores SIGTERM returned %v, want that it was killed", err)
	}
	if p.Err() == nil || p.Err().Error() != "signal: killed" || p.ExitCode() != -1 {
		t.Fatalf("the child ended with %v (exit code %d), want killed by SIGKILL", p.Err(), p.ExitCode())
	}
	if err := p.Stop(time.Minute); err != nil {
		t.Fatalf("Stop of a process that has exited: %v", err)
	}
}

// Wait returns when the process exits by itself, and kills it when it does not in time.
func TestProcessWait(t *testing.T) {
	p := NewProcess(t, FindTool("true"), nil, nil, nil)
	if err := p.Wait(time.Minute); err != nil {
		t.Fatal(err)
	}
	if p.Err() != nil || p.ExitCode() != 0 {
		t.Fatalf("true ended with %v (exit code %d)", p.Err(), p.ExitCode())
	}
	p, out := Rerun(t, "TestProcessChild", childRoleEnv+"=stubborn")
	waitLine(t, out, "ready")
	if err := p.Wait(100 * time.Millisecond); err == nil {
		t.Fatal("Wait of a process that does not exit returned nil")
	}
	select {
	case <-p.Done():
	default:
		t.Fatal("the process still runs after Wait gave up on it")
	}
}
