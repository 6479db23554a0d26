package engine_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/strictrate/strictrate/engine"
	"github.com/strictrate/strictrate/internal/enginetest"
)

// maxFuzzKey bounds the fuzzed string of FuzzAllowN's key. Go minimizes each new interesting
// input's strings one candidate at a time, each candidate a whole run of the fuzz function
// (some 30 round trips): it removes every byte, then every range of bytes, then tries 32
// printable bytes in place of each, some L + L²/2 + 32L runs for a string of L bytes whose
// length its coverage depends on. A key's always does, since every command hashes the key
// byte by byte (valkey-go's slot). A fuzzed 4 KB key took the whole budget Go gives one
// minimization, half of CI's 8,000 runs, some 20 seconds of "0 execs/sec" while the other
// worker idled. At 16 bytes a minimization is at most some 650 runs, and the length of long
// keys comes from pad, which Go does not minimize.
const maxFuzzKey = 16

// FuzzAllowN throws arbitrary keys (any bytes, any length), limits, windows and costs (up to
// MaxEvents) at the engine: it must never panic, must answer bad input with
// ErrInvalidArgument and write nothing, and otherwise must admit exactly while the limit has
// room, give back exactly a refunded request's cost, and never let the log exceed Max. CI runs
// it for a bounded number of inputs: go test -run='^$' -fuzz=FuzzAllowN -fuzztime=8000x ./engine/
//
// A key is up to maxFuzzKey fuzzed bytes, then pad%4096 zero bytes: any bytes, any length up
// to 4 KiB, but only a short string for Go to minimize (see maxFuzzKey).
func FuzzAllowN(f *testing.F) {
	for _, seed := range []struct {
		key    string
		pad    uint16
		max    int
		window int64
		n      int
	}{
		{"user:1", 0, 3, 1_000_000, 1},
		{"", 0, 3, 1_000_000, 1},
		{"k", 0, 0, 1_000_000, 1},
		{"k", 0, 5, 999, 1},
		{"k", 0, 5, 1000, 6},
		{"k", 0, 5, 1000, 0},
		{"\x00\xff{braces}\r\n", 0, 2, 50_000, 2},
		{"\x00", 4095, 1, 3_600_000_000, 1},
		{"{", 4095, 2, 1_000_000, 1},
		{"k", 0, engine.MaxEvents, 1 << 50, 1},
		{"k", 0, 1, 1<<62 + 1, 1},
		{"k", 0, -7, -1, -1},
	} {
		f.Add(seed.key, seed.pad, seed.max, seed.window, seed.n)
	}
	c := exampleServer.Client(f)
	// A frozen caller's clock: the window cannot slide while one input is checked, so the
	// admitted count must be exact even for a 1ms window (and every event shares one
	// microsecond, which exercises the members' collision path).
	at := time.Date(2026, 11, 30, 0, 0, 0, 0, time.UTC)
	e, err := engine.New(c, engine.WithClock(func() time.Time { return at }))
	if err != nil {
		f.Fatal(err)
	}
	onServerClock, err := engine.New(c)
	if err != nil {
		f.Fatal(err)
	}
	ctx := context.Background()

	f.Fuzz(func(t *testing.T, key string, pad uint16, max int, windowMicros int64, n int) {
		if len(key) > maxFuzzKey {
			key = key[:maxFuzzKey]
		}
		key += strings.Repeat("\x00", int(pad%4096))
		l := engine.Limit{Max: max, Window: time.Duration(windowMicros) * time.Microsecond}
		if key != "" {
			// The fuzzer runs inputs in several processes at once, and many inputs share a
			// key ("k"): each input gets a key of its own, ending in the fuzzed bytes.
			key = uuid.NewString() + ":" + key
			if err := e.Reset(ctx, key); err != nil {
				t.Fatalf("Reset: %v", err)
			}
		}
		r, err := e.AllowN(ctx, key, l, n)
		if err != nil {
			if !errors.Is(err, engine.ErrInvalidArgument) {
				t.Fatalf("AllowN(%q, %+v, %d): %v, want nil or ErrInvalidArgument", key, l, n, err)
			}
			if key != "" {
				if got := enginetest.StoredEvents(t, c, key); got != 0 {
					t.Fatalf("refused call left %d events", got)
				}
			}
			return
		}
		// A fresh key with n <= Max: admitted, and the rest is exact. The key's expiry runs on
		// the server's real clock, so below a second it may lapse while this loop runs; there
		// only the bounds are checked.
		exact := l.Window >= time.Second
		if !r.Allowed || r.Remaining != max-n {
			t.Fatalf("first AllowN(%d) of %d: %+v", n, max, r)
		}
		admitted := n
		for i := 0; i < 20 && admitted < max+1; i++ {
			r, err := e.Allow(ctx, key, l)
			if err != nil {
				t.Fatalf("Allow: %v", err)
			}
			if r.Remaining < 0 || r.Remaining > max {
				t.Fatalf("Remaining %d outside [0, %d]", r.Remaining, max)
			}
			if exact && r.Allowed != (admitted < max) {
				t.Fatalf("with %d of %d admitted: Allowed %v", admitted, max, r.Allowed)
			}
			if r.Allowed {
				admitted++
			}
		}
		if got := enginetest.StoredEvents(t, c, key); exact && got != int64(admitted) || got > int64(max) {
			t.Fatalf("log holds %d, admitted %d, Max %d", got, admitted, max)
		}
		// Refunding the first request gives back its n events, once.
		for i := 0; i < 2; i++ {
			if err := e.Refund(ctx, key, r); err != nil {
				t.Fatalf("Refund: %v", err)
			}
		}
		if got := enginetest.StoredEvents(t, c, key); exact && got != int64(admitted-n) || got > int64(max) {
			t.Fatalf("after refunding %d of %d admitted: log holds %d", n, admitted, got)
		}
		// The server's clock moves, so only the bound holds: the log never exceeds Max.
		for i := 0; i < 3; i++ {
			if _, err := onServerClock.AllowN(ctx, key, l, n); err != nil {
				t.Fatalf("AllowN on the server's clock: %v", err)
			}
		}
		if got := enginetest.StoredEvents(t, c, key); got > int64(max) {
			t.Fatalf("log holds %d, Max %d", got, max)
		}
		if err := e.Reset(ctx, key); err != nil {
			t.Fatalf("Reset: %v", err)
		}
	})
}
