package enginetest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/google/uuid"
	"github.com/valkey-io/valkey-go"

	"github.com/strictrate/strictrate/engine"
	"github.com/strictrate/strictrate/inspect"
	"github.com/strictrate/strictrate/internal/valkeytest"
)

// Prefix is the engine's default key prefix: an engine made without engine.WithPrefix keeps
// key's log at Prefix+key on the server. StoredEvents and StoredEntries read keys under it.
const Prefix = "strictrate:"

// NewKey returns a key no other test or run uses: tb's name and a random UUID.
func NewKey(tb testing.TB) string { return tb.Name() + ":" + uuid.NewString() }

// Want fails tb, naming what, unless got equals want (==, so both must have the same dynamic
// type: int64(5), not 5, against an int64).
func Want(tb testing.TB, what string, got, want any) {
	tb.Helper()
	if got != want {
		tb.Fatalf("%s = %v, want %v", what, got, want)
	}
}

// MustAllowN returns e.AllowN's result for n events on key under l, and fails tb on an error.
func MustAllowN(tb testing.TB, e *engine.Engine, key string, l engine.Limit, n int) engine.Result {
	tb.Helper()
	r, err := e.AllowN(context.Background(), key, l, n)
	if err != nil {
		tb.Fatalf("AllowN(%d): %v", n, err)
	}
	return r
}

// MustAllowPolicy returns e.AllowPolicy's result for n events on key under p, and fails tb on
// an error.
func MustAllowPolicy(tb testing.TB, e *engine.Engine, key string, p engine.Policy, n int) engine.Result {
	tb.Helper()
	r, err := e.AllowPolicy(context.Background(), key, p, n)
	if err != nil {
		tb.Fatalf("AllowPolicy(%s, %d): %v", p, n, err)
	}
	return r
}

// MustPeek returns e.Peek's result for key under l, and fails tb on an error.
func MustPeek(tb testing.TB, e *engine.Engine, key string, l engine.Limit) engine.Result {
	tb.Helper()
	r, err := e.Peek(context.Background(), key, l)
	if err != nil {
		tb.Fatalf("Peek: %v", err)
	}
	return r
}

// StoredEvents is Events for key under Prefix: the events key's log holds.
func StoredEvents(tb testing.TB, c valkey.Client, key string) int64 {
	tb.Helper()
	return Events(tb, c, Prefix, key)
}

// StoredEntries is key's log under Prefix as stored: every entry's time and cost, oldest
// first. A key that does not exist has none.
func StoredEntries(tb testing.TB, c valkey.Client, key string) []inspect.Entry {
	tb.Helper()
	return Log(tb, c, Prefix, key).Entries
}

// PTTL returns the server's PTTL of full, a key's whole name (Prefix+key for a log under the
// default prefix): milliseconds to its expiry, -1 without one, -2 when it does not exist. It
// fails tb when the command fails.
func PTTL(tb testing.TB, c valkey.Client, full string) int64 {
	tb.Helper()
	return valkeytest.Must(tb, "PTTL", c.Do(context.Background(), c.B().Pttl().Key(full).Build()), valkey.ValkeyResult.AsInt64)
}

// Engines returns clients engines on s (made by New, with opts), each on a valkey-go client of
// its own, so each with its own connections, and the first of those clients.
func Engines(tb testing.TB, s *valkeytest.Server, clients int, opts ...engine.Option) ([]*engine.Engine, valkey.Client) {
	tb.Helper()
	var es []*engine.Engine
	var first valkey.Client
	for i := 0; i < clients; i++ {
		c := s.Client(tb)
		if first == nil {
			first = c
		}
		es = append(es, New(tb, c, opts...))
	}
	return es, first
}

// RunConcurrently makes requests calls of do from goroutines goroutines, which take engines in
// turn (goroutine g uses engines[g%len(engines)]) and all start at once, and returns every
// result, in no particular order. An error ends its goroutine and fails tb once all are done.
// An engine is the exact one (*engine.Engine) or package pipelined's.
func RunConcurrently[E any](tb testing.TB, engines []E, goroutines, requests int, do func(e E) (engine.Result, error)) []engine.Result {
	tb.Helper()
	var (
		next    atomic.Int64
		mu      sync.Mutex
		results []engine.Result
		wg      sync.WaitGroup
		errs    = make(chan error, goroutines)
		start   = make(chan struct{})
	)
	for g := 0; g < goroutines; g++ {
		e := engines[g%len(engines)]
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			for next.Add(1) <= int64(requests) {
				r, err := do(e)
				if err != nil {
					errs <- err
					return
				}
				mu.Lock()
				results = append(results, r)
				mu.Unlock()
			}
		}()
	}
	close(start)
	wg.Wait()
	close(errs)
	for err := range errs {
		tb.Fatal(err)
	}
	return results
}

// WantRefused runs call on a fresh key under Prefix, absent or (existing) holding the events
// fill adds, and fails tb unless call answers engine.ErrInvalidArgument and the key keeps its
// log and its expiry: at most two minutes (and the millisecond it was rounded up by) for an
// existing key, none for an absent one.
func WantRefused(tb testing.TB, c valkey.Client, existing bool, fill func(key string), call func(key string) error) {
	tb.Helper()
	key := NewKey(tb)
	var before []inspect.Entry
	if existing {
		fill(key)
		before = StoredEntries(tb, c, key)
	}
	if err := call(key); !errors.Is(err, engine.ErrInvalidArgument) {
		tb.Fatalf("err = %v, want ErrInvalidArgument", err)
	}
	after := StoredEntries(tb, c, key)
	if fmt.Sprint(after) != fmt.Sprint(before) {
		tb.Fatalf("log changed from %v to %v", before, after)
	}
	// An existing key's expiry is a minute after its newest entry, and up to a window more of
	// slack (a small header of layout 5 keeps the expiry it set: lib_small.lua), rounded up to
	// the millisecond: read within the millisecond of that entry, PTTL is at most 120,001.
	if ttl := PTTL(tb, c, Prefix+key); existing && (ttl <= 0 || ttl > 120_001) || !existing && ttl != -2 {
		tb.Fatalf("PTTL %d after a refused call", ttl)
	}
}
