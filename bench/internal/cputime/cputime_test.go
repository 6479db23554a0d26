//go:build unix

package cputime_test

import (
	"context"
	"testing"
	"time"

	"github.com/strictrate/strictrate/bench/internal/cputime"
)

// Work on the CPU shows up in Process: it grows, and never runs backwards. A shared machine
// may hand this process little CPU, so the test spins until the clock moves, within a
// generous bound, instead of expecting an amount.
func TestProcessGrowsWithWork(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	start := cputime.Process()
	if start <= 0 {
		t.Fatalf("Process() = %v at the start; a running test has used some CPU", start)
	}
	x := uint64(1)
	for ctx.Err() == nil {
		for range 1_000_000 {
			x = x*6364136223846793005 + 1442695040888963407
		}
		now := cputime.Process()
		if now < start {
			t.Fatalf("Process() went from %v back to %v", start, now)
		}
		if now > start {
			return
		}
	}
	t.Fatalf("Process() stayed at %v through 30 s of work (%d)", start, x)
}
