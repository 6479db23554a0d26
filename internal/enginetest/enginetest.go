// Package enginetest holds what the tests of the engine and of the packages built on it share:
// a caller's clock the test moves by hand, the instant those clocks start at, and a constructor
// that fails the test instead of returning an error; fresh keys, decisions that fail the test
// on an error (MustAllowN, MustAllowPolicy, MustPeek), readings of what the server stores
// (Events, Log, StoredEvents, StoredEntries, PTTL), engines on clients of their own fired at
// concurrently (Engines, RunConcurrently), and the checks the tests repeat (Want, WantRefused).
// Starting and stopping servers is valkeytest's business, not this package's: Engines only
// connects to a server it is given.
package enginetest

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/valkey-io/valkey-go"

	"github.com/strictrate/strictrate/engine"
	"github.com/strictrate/strictrate/inspect"
)

// T0 is the instant the tests' clocks start at: a fixed date, so that every figure a test
// derives from a caller's clock is exact.
var T0 = time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)

// Clock is a caller's clock the test moves by hand: pass its Now to engine.WithClock. It is
// safe for concurrent use. The zero Clock reads the zero time until Set.
type Clock struct {
	mu sync.Mutex
	t  time.Time
}

// NewClock returns a Clock that reads t.
func NewClock(t time.Time) *Clock { return &Clock{t: t} }

// Now returns the time the clock was last set to.
func (c *Clock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }

// Set moves the clock to t, forward or back.
func (c *Clock) Set(t time.Time) { c.mu.Lock(); c.t = t; c.mu.Unlock() }

// New returns an engine on c with opts, and fails tb if engine.New refuses. The tests' servers
// run without persistence on purpose, so the persistence check is off unless opts turn it on
// again (engine.WithPersistenceCheck).
func New(tb testing.TB, c valkey.Client, opts ...engine.Option) *engine.Engine {
	tb.Helper()
	e, err := engine.New(c, append([]engine.Option{engine.WithPersistenceCheck(engine.Ignore)}, opts...)...)
	if err != nil {
		tb.Fatalf("engine.New: %v", err)
	}
	return e
}

// Clocked returns an engine on c with opts whose clock is a new Clock reading T0, and that
// Clock, for the test to move.
func Clocked(tb testing.TB, c valkey.Client, opts ...engine.Option) (*engine.Engine, *Clock) {
	tb.Helper()
	clock := NewClock(T0)
	return New(tb, c, append(opts[:len(opts):len(opts)], engine.WithClock(clock.Now))...), clock
}

// Log reads key's log (the key without the engine's prefix) through package inspect, and fails
// tb when it cannot. A key that does not exist has an empty log.
func Log(tb testing.TB, c valkey.Client, prefix, key string) inspect.Log {
	tb.Helper()
	l, err := inspect.Read(context.Background(), c, prefix+key, 0)
	if err != nil {
		tb.Fatalf("inspect %q: %v", key, err)
	}
	return l
}

// Events returns the events key's log holds: the total cost of its entries, or, for the
// pipelined design's sorted set, its members (ZCARD). Entries that left the window but were not
// trimmed yet count, until the next decision trims them.
func Events(tb testing.TB, c valkey.Client, prefix, key string) int64 {
	tb.Helper()
	kind, err := c.Do(context.Background(), c.B().Type().Key(prefix+key).Build()).ToString()
	if err != nil {
		tb.Fatalf("TYPE %q: %v", key, err)
	}
	if kind == "zset" {
		n, err := c.Do(context.Background(), c.B().Zcard().Key(prefix+key).Build()).AsInt64()
		if err != nil {
			tb.Fatalf("ZCARD %q: %v", key, err)
		}
		return n
	}
	return int64(Log(tb, c, prefix, key).Events)
}
