package engine_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/strictrate/strictrate/engine"
	"github.com/strictrate/strictrate/internal/enginetest"
)

// A Refund or Settle names the log it refunds in: a Result's entry carries its log's name, and
// one given another key, or run by an engine of another prefix, is ErrUnknownEntry (and
// ErrInvalidArgument), before anything is sent; neither the right key nor the wrong one gets
// anything back. The right call still refunds, a retry of it is nil and changes nothing, and a
// refund of an entry that has left the window is a no-op.
func TestRefundNamesItsEntry(t *testing.T) {
	c := exampleServer.Client(t)
	ctx := context.Background()
	e, clock := enginetest.Clocked(t, c)
	other := enginetest.New(t, c, engine.WithPrefix("other-prefix:"), engine.WithClock(clock.Now))
	key, wrong, l := enginetest.NewKey(t), enginetest.NewKey(t), engine.PerMinute(3)

	r := enginetest.MustAllowN(t, e, key, l, 2)
	enginetest.Want(t, "the entry's log", r.Entry.Key, enginetest.Prefix+key)
	enginetest.MustAllowN(t, e, wrong, l, 2)
	for name, call := range map[string]func() error{
		"Refund of another key":                   func() error { return e.Refund(ctx, wrong, r) },
		"Settle of another key":                   func() error { return e.Settle(ctx, wrong, r, 1) },
		"Refund by an engine of another prefix":   func() error { return other.Refund(ctx, key, r) },
		"Refund of an entry whose log is unnamed": func() error { s := r; s.Entry.Key = ""; return e.Refund(ctx, key, s) },
	} {
		err := call()
		if !errors.Is(err, engine.ErrUnknownEntry) || !errors.Is(err, engine.ErrInvalidArgument) {
			t.Errorf("%s: %v, want ErrUnknownEntry and ErrInvalidArgument", name, err)
		}
	}
	enginetest.Want(t, "the key's events after refused refunds", enginetest.StoredEvents(t, c, key), int64(2))
	enginetest.Want(t, "the other key's events", enginetest.StoredEvents(t, c, wrong), int64(2))

	for i := range 2 {
		if err := e.Refund(ctx, key, r); err != nil {
			t.Fatalf("refund %d: %v", i+1, err)
		}
		enginetest.Want(t, "remaining after the refund", enginetest.MustPeek(t, e, key, l).Remaining, 3)
	}

	// An entry that has left the window: its refund is a no-op, nil.
	old := enginetest.MustAllowN(t, e, key, l, 1)
	clock.Set(clock.Now().Add(l.Window + time.Second))
	full := enginetest.MustAllowN(t, e, key, l, 3)
	enginetest.Want(t, "a fresh window filled", full.Allowed, true)
	if err := e.Refund(ctx, key, old); err != nil {
		t.Fatalf("refund of an entry that left the window: %v", err)
	}
	enginetest.Want(t, "remaining after it", enginetest.MustPeek(t, e, key, l).Remaining, 0)
}

// A denied Acquire says what a holder-to-be needs: a *LeaseDeniedError (matching
// ErrRateLimitExceeded) with the holders, the key's max, and when the first and the last held
// lease expire.
func TestLeaseDenialSaysWhoHoldsAndUntilWhen(t *testing.T) {
	c := exampleServer.Client(t)
	ctx := context.Background()
	e, clock := enginetest.Clocked(t, c)
	key := enginetest.NewKey(t)
	first, err := e.Acquire(ctx, key, 2, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	clock.Set(enginetest.T0.Add(time.Second))
	last, err := e.Acquire(ctx, key, 2, 20*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	clock.Set(enginetest.T0.Add(4 * time.Second))
	_, err = e.Acquire(ctx, key, 2, time.Second)
	var denied *engine.LeaseDeniedError
	if !errors.As(err, &denied) || !errors.Is(err, engine.ErrRateLimitExceeded) {
		t.Fatalf("Acquire of a full key: %v, want a *LeaseDeniedError matching ErrRateLimitExceeded", err)
	}
	want := engine.LeaseDeniedError{Key: key, Max: 2, Holders: 2, At: enginetest.T0.Add(4 * time.Second),
		NextExpiry: first.Expires, LastExpiry: last.Expires}
	if denied.Key != want.Key || denied.Max != want.Max || denied.Holders != want.Holders || !denied.At.Equal(want.At) ||
		!denied.NextExpiry.Equal(want.NextExpiry) || !denied.LastExpiry.Equal(want.LastExpiry) {
		t.Fatalf("denial %+v, want %+v", *denied, want)
	}
	enginetest.Want(t, "RetryAfter", denied.RetryAfter(), 6*time.Second)
}
