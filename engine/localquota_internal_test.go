package engine

import (
	"context"
	"testing"
	"time"
)

// Reserve is reserve, for the tests of package engine_test: reservations are local quota's
// ground, not yet part of the API.
func (e *Engine) Reserve(ctx context.Context, key string, p Policy, k int, hold time.Duration) (Result, error) {
	return e.reserve(ctx, key, p, k, hold)
}

// sweep drops the holders that hold no reservation and were not asked about for two holds,
// and keeps those with a reservation held or a call in flight, and those asked about lately.
func TestLocalQuotaSweep(t *testing.T) {
	lq, err := newLocalQuotas(nil, LocalQuota{Hold: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	old := now.Add(-time.Second)
	for id, h := range map[string]*holder{
		"idle":           {since: old},
		"asked lately":   {since: now.Add(-50 * time.Millisecond)},
		"holding":        {since: old, gen: 1},
		"in flight":      {since: old, pending: true},
		"settled, idle":  {since: old, gen: 2, settled: true},
		"never asked at": {},
	} {
		h.hold = lq.hold
		lq.holders[holderID{key: id}] = h
	}
	if dropped := lq.sweep(now); dropped != 3 {
		t.Errorf("sweep dropped %d holders, want 3", dropped)
	}
	for _, id := range []string{"asked lately", "holding", "in flight"} {
		if lq.holders[holderID{key: id}] == nil {
			t.Errorf("sweep dropped %q", id)
		}
	}
	if len(lq.holders) != 3 {
		t.Errorf("%d holders left, want 3", len(lq.holders))
	}
}
