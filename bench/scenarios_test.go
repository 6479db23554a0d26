package main

import (
	"context"
	"errors"
	"net"
	"os"
	"testing"
	"time"
)

// A run ends at its deadline whichever way the client reports it; an error before the
// deadline is a failure of the run.
func TestRunEndedOnlyAtTheDeadline(t *testing.T) {
	passed, cancel := context.WithDeadline(context.Background(), time.Now().Add(-time.Millisecond))
	defer cancel()
	live, cancelLive := context.WithTimeout(context.Background(), time.Hour)
	defer cancelLive()
	dialTimeout := &net.OpError{Op: "dial", Net: "tcp", Err: os.ErrDeadlineExceeded}
	for _, tc := range []struct {
		name string
		ctx  context.Context
		err  error
		want bool
	}{
		{"a lazy dial cut short by the deadline", passed, dialTimeout, true},
		{"the client's report of the deadline", live, context.DeadlineExceeded, true},
		{"a dial that timed out before the deadline", live, dialTimeout, false},
		{"a refused connection after the deadline", passed, errors.New("connection refused"), true},
		{"a refused connection before it", live, errors.New("connection refused"), false},
	} {
		if got := runEnded(tc.ctx, tc.err); got != tc.want {
			t.Errorf("%s: runEnded = %v, want %v", tc.name, got, tc.want)
		}
	}
}
