package engine

import (
	"testing"
	"time"
)

// One key asked with ever new limits keeps at most maxDenialsPerKey denials: 50,000 distinct
// limits on one key used to keep all 50,000 (+14 MB). The newest denial is still answered.
func TestDenyCacheBoundsAKeysDenials(t *testing.T) {
	c, err := newDenyCache(8)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Unix(1_800_000_000, 0)
	var last *limitSet
	for i := 0; i < 50_000; i++ {
		last = newLimitSet([]Limit{{Max: 1 + i, Window: time.Hour}})
		c.store("k", last, 1, Result{RetryAfter: time.Minute}, now, now, c.epoch("k"))
	}
	kd, _ := c.keys.Get("k")
	if n := len(kd.list); n > maxDenialsPerKey {
		t.Fatalf("the key keeps %d denials, want at most %d", n, maxDenialsPerKey)
	}
	if _, ok := c.lookup("k", last, 1, now.Add(time.Second)); !ok {
		t.Fatal("lookup of the newest denial found nothing, want it answered")
	}
	// Denials that ran out leave first.
	c.store("k", newLimitSet([]Limit{{Max: 1, Window: time.Second}}), 1, Result{RetryAfter: time.Second}, now.Add(2*time.Minute), now.Add(2*time.Minute), c.epoch("k"))
	if kd, _ := c.keys.Get("k"); len(kd.list) != 1 {
		t.Fatalf("after every earlier denial ran out the key keeps %d, want 1", len(kd.list))
	}
}

// A denial whose call was sent before its key was given events back is never stored, and one
// stored is dropped by the forget that follows the give-back: epochs order the two.
func TestDenyCacheDropsADenialThatRacedAGiveBack(t *testing.T) {
	c, err := newDenyCache(10)
	if err != nil {
		t.Fatal(err)
	}
	set := newLimitSet([]Limit{{Max: 5, Window: time.Hour}})
	now := time.Now()
	denied := Result{RetryAfter: time.Hour}
	sent := c.epoch("k")
	c.forget("k") // a refund is sent
	c.store("k", set, 1, denied, now, now, sent)
	if _, ok := c.lookup("k", set, 1, now); ok {
		t.Fatal("a denial sent before a give-back, back after it, was stored")
	}
	after := c.epoch("k")
	c.store("k", set, 1, denied, now, now, after)
	if _, ok := c.lookup("k", set, 1, now); !ok {
		t.Fatal("a denial sent after the give-back's forget was not stored")
	}
	c.forget("k") // the refund came back
	if _, ok := c.lookup("k", set, 1, now); ok {
		t.Fatal("a denial stored while a give-back was in flight outlived its return")
	}
	other := c.epoch("other")
	c.forget("k")
	c.store("other", set, 1, denied, now, now, other)
	if _, ok := c.lookup("other", set, 1, now); ok != (c.stripe("other") != c.stripe("k")) {
		t.Fatalf("another key's denial stored: %v; want stored unless it shares the key's stripe", ok)
	}
}
