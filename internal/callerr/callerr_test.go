package callerr

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"testing"
	"time"

	"github.com/valkey-io/valkey-go"
)

func TestClassify(t *testing.T) {
	expired, cancel := context.WithDeadline(context.Background(), time.Now().Add(-time.Second))
	defer cancel()
	// The caller's own deadline, passed: the caller's error, not the server's.
	if err := Classify(expired, "op", context.DeadlineExceeded); !errors.Is(err, context.DeadlineExceeded) || errors.Is(err, ErrUnavailable) {
		t.Errorf("the caller's deadline: %v", err)
	}
	// A connection dialed on the caller's context, cut short by its deadline, says "i/o
	// timeout" (os.ErrDeadlineExceeded), often before the context's own timer has fired: the
	// caller's deadline still.
	dialTimeout := &net.OpError{Op: "dial", Net: "tcp", Err: os.ErrDeadlineExceeded}
	if err := Classify(expired, "op", dialTimeout); !errors.Is(err, context.DeadlineExceeded) || errors.Is(err, ErrUnavailable) {
		t.Errorf("a dial cut short by the caller's deadline: %v", err)
	}
	// While the caller's context is live, the same timeout is the client's own.
	if err := Classify(context.Background(), "op", dialTimeout); !errors.Is(err, ErrUnavailable) || errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("a dial that timed out on its own: %v", err)
	}
	// The same error while the caller's context is live is the client's own timeout: the
	// server did not answer, and nothing says the caller gave up.
	for _, own := range []error{context.DeadlineExceeded, context.Canceled} {
		if err := Classify(context.Background(), "op", own); !errors.Is(err, ErrUnavailable) || errors.Is(err, own) {
			t.Errorf("the client's own %v: %v; want ErrUnavailable, not the context error", own, err)
		}
	}
	c := func(err error) error { return Classify(context.Background(), "op", err) }
	if err := c(valkey.ErrClosing); !errors.Is(err, ErrUnavailable) || !errors.Is(err, valkey.ErrClosing) {
		t.Errorf("closing: %v", err)
	}
	if err := c(errors.New("dial tcp: connection refused")); !errors.Is(err, ErrUnavailable) {
		t.Errorf("dial: %v", err)
	}
}

// The error replies of a server that cannot answer now are ErrUnavailable; other error
// replies are the server refusing the request, and are not.
func TestServerCannotAnswer(t *testing.T) {
	for reply, unavailable := range map[string]bool{
		"LOADING Valkey is loading the dataset in memory":                        true,
		"CLUSTERDOWN The cluster is down":                                        true,
		"TRYAGAIN Multiple keys request during rehashing of slot":                true,
		"MASTERDOWN Link with MASTER is down and replica-serve-stale-data is no": true,
		"BUSY Valkey is busy running a script. You can only call SCRIPT KILL":    true,
		"READONLY You can't write against a read only replica.":                  true,
		"OOM command not allowed when used memory > 'maxmemory'.":                true,
		"OOMPH not a reply any server gives":                                     false,
		"WRONGTYPE Operation against a key holding the wrong kind of value":      false,
		"NOPERM User has no permissions to run the 'evalsha' command":            false,
		"ERR Error running script (call to f_x): @user_script:1: bad":            false,
		"BUSYGROUP Consumer Group name already exists":                           false,
		"BUSYKEY Target key name already exists.":                                false,
		"NOSCRIPT No matching script. Please use EVAL.":                          false,
		"": false,
		"ERR LOADING is not a prefix here, only a word in the message": false,
	} {
		if got := serverCannotAnswer(reply); got != unavailable {
			t.Errorf("serverCannotAnswer(%q) = %v, want %v", reply, got, unavailable)
		}
	}
}

// A caller's own end is its context cancelled or its deadline passed, even a moment before the
// context's timer fires; a context ended with a cause wrapping ErrUnavailable is a bound on the
// server's answer, not the caller's end.
func TestCallerEnded(t *testing.T) {
	if CallerEnded(context.Background()) {
		t.Fatal("a live context: ended")
	}
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	passed, cancelPassed := context.WithDeadline(context.Background(), time.Now().Add(-time.Millisecond))
	defer cancelPassed()
	bound, cancelBound := context.WithTimeoutCause(context.Background(), time.Millisecond, fmt.Errorf("%w: bound", ErrUnavailable))
	defer cancelBound()
	time.Sleep(2 * time.Millisecond) // its deadline passes; its timer may not have fired yet
	switch {
	case !CallerEnded(cancelled):
		t.Fatal("a cancelled context: not ended")
	case !CallerEnded(passed):
		t.Fatal("a context past its deadline: not ended")
	case CallerEnded(bound):
		t.Fatal("a bound on the server's answer that passed: the caller's end")
	}
	err := Classify(bound, "allow", context.DeadlineExceeded)
	if !errors.Is(err, ErrUnavailable) || errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a bound on the server's answer that passed: %v, want ErrUnavailable and no deadline", err)
	}
}
