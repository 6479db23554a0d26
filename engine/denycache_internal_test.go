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
		c.store("k", last, 1, Result{RetryAfter: time.Minute}, now, now)
	}
	kd, _ := c.keys.Get("k")
	if n := len(kd.list); n > maxDenialsPerKey {
		t.Fatalf("the key keeps %d denials, want at most %d", n, maxDenialsPerKey)
	}
	if _, ok := c.lookup("k", last, 1, now.Add(time.Second)); !ok {
		t.Fatal("lookup of the newest denial found nothing, want it answered")
	}
	// Denials that ran out leave first.
	c.store("k", newLimitSet([]Limit{{Max: 1, Window: time.Second}}), 1, Result{RetryAfter: time.Second}, now.Add(2*time.Minute), now.Add(2*time.Minute))
	if kd, _ := c.keys.Get("k"); len(kd.list) != 1 {
		t.Fatalf("after every earlier denial ran out the key keeps %d, want 1", len(kd.list))
	}
}
