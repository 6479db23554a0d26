package engine

import (
	"context"
	"runtime"
	"strconv"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/strictrate/strictrate/internal/valkeytest"
)

// sweep drops the holders that hold no reservation and were not asked about for two holds,
// and keeps those with a reservation held or a call in flight, and those asked about lately.
// It looks only at holders that are due: one it keeps is due again two holds on.
func TestLocalQuotaSweepDropsOnlyIdleHolders(t *testing.T) {
	lq, err := newLocalQuotas(nil, LocalQuota{Hold: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	set := newLimitSet([]Limit{{Max: 10, Window: time.Second}})
	now := time.Now()
	old := now.Add(-time.Second)
	holders := map[string]struct {
		h    *holder
		kept bool // by the sweep at now
	}{
		"idle":           {&holder{since: old}, false},
		"asked lately":   {&holder{since: now.Add(-50 * time.Millisecond)}, true},
		"holding":        {&holder{since: old, cur: &reservation{}}, true},
		"in flight":      {&holder{since: old, pending: true}, true},
		"settled, idle":  {&holder{since: old, cur: &reservation{settled: true}}, false},
		"never asked at": {&holder{}, false},
	}
	for key, tc := range holders {
		tc.h.key, tc.h.set, tc.h.hold = key, set, lq.hold
		lq.holders[holderIDOf(key, set)] = tc.h
		lq.enqueue(tc.h, old)
	}
	if dropped := lq.sweep(now); dropped != 3 || lq.swept != 6 {
		t.Errorf("sweep dropped %d holders, looking at %d, want 3 of 6", dropped, lq.swept)
	}
	for key, tc := range holders {
		if kept := lq.holders[holderIDOf(key, set)] != nil; kept != tc.kept {
			t.Errorf("sweep kept %q: %v, want %v", key, kept, tc.kept)
		}
	}
	if len(lq.holders) != 3 {
		t.Errorf("%d holders left, want 3", len(lq.holders))
	}
	if dropped := lq.sweep(now.Add(2*lq.hold - time.Millisecond)); dropped != 0 || lq.swept != 6 {
		t.Errorf("a sweep before the holders kept are due dropped %d, looking at %d more; want 0 and 0", dropped, lq.swept-6)
	}
	// Two holds on, "asked lately" was not asked about for two holds.
	if dropped := lq.sweep(now.Add(2 * lq.hold)); dropped != 1 || lq.holders[holderIDOf("asked lately", set)] != nil {
		t.Errorf("two holds on, sweep dropped %d holders, want \"asked lately\"", dropped)
	}
}

// reserved is h's current reservation, read under h.mu.
func (h *holder) reserved() *reservation {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.cur
}

// A flood of new keys, five times the holders the engine keeps, all within one hold: the
// holders never pass the bound, the sweeps look at no holder that is not due (before, each new
// key past the bound looked at every holder kept, and found none to drop), a key past the
// bound is decided by the server, and no key admits more than Max, a key in demand from its
// reservations through the flood. Once the holders are due, the sweeps drop the idle ones,
// looking at each holder once, and new keys get holders again.
func TestLocalQuotaFloodOfNewKeys(t *testing.T) {
	const hold, bound = time.Minute, 200 // the flood takes far less than one hold
	e, err := New(valkeytest.New(t).Client(t), WithLocalQuota(LocalQuota{Hold: hold, MinDemand: 4}))
	if err != nil {
		t.Fatal(err)
	}
	lq := e.local
	lq.maxKeys = bound
	l := Limit{Max: 10, Window: time.Hour}
	ctx, prefix := context.Background(), t.Name()+":"+uuid.NewString()+":"
	allow := func(key string, times int) (admitted int) {
		for range times {
			r, err := e.Allow(ctx, key, l)
			if err != nil {
				t.Fatalf("Allow %s: %v", key, err)
			}
			if r.Allowed {
				admitted++
			}
		}
		return admitted
	}
	holderOf := func(key string) *holder {
		lq.mu.RLock()
		defer lq.mu.RUnlock()
		return lq.holders[holderIDOf(key, e.oneLimit(l))]
	}
	holders := func() int {
		lq.mu.RLock()
		defer lq.mu.RUnlock()
		return len(lq.holders)
	}

	hot := prefix + "hot"
	admitted := allow(hot, 6)
	for i := range 5 * bound {
		if allow(prefix+"flood:"+strconv.Itoa(i), 1) != 1 {
			t.Fatalf("new key %d of the flood denied, want an admission", i)
		}
		if n := holders(); n > bound {
			t.Fatalf("%d holders after %d new keys, want at most the bound %d", n, i+1, bound)
		}
	}
	lq.mu.RLock()
	swept := lq.swept
	lq.mu.RUnlock()
	if swept != 0 {
		t.Errorf("the sweeps of %d new keys looked at %d holders, none of them due; want 0", 5*bound, swept)
	}
	if admitted += allow(hot, 3*l.Max); admitted != l.Max {
		t.Errorf("the key in demand admitted %d, want Max %d", admitted, l.Max)
	}
	if h := holderOf(hot); h == nil || h.reserved() == nil {
		t.Errorf("the key in demand has holder %v, want one with a reservation", h)
	}
	past := prefix + "past the bound"
	if admitted := allow(past, 3*l.Max); admitted != l.Max {
		t.Errorf("a key past the bound admitted %d, want Max %d", admitted, l.Max)
	}
	if holderOf(past) != nil {
		t.Errorf("a key past the bound has a holder, want none")
	}

	// Two holds on, every holder is due: the idle ones are dropped, the one holding a
	// reservation is kept; each is looked at once.
	later := time.Now().Add(2 * hold)
	lq.mu.Lock()
	dropped := 0
	for n := lq.sweep(later); n > 0; n = lq.sweep(later) {
		dropped += n
	}
	swept = lq.swept
	lq.mu.Unlock()
	if n := holders(); n != 1 || dropped != bound-1 || swept != bound {
		t.Errorf("two holds on, %d holders kept, %d dropped, %d looked at; want 1, %d, %d", n, dropped, swept, bound-1, bound)
	}
	if allow(past, 1) != 0 || holderOf(past) == nil {
		t.Errorf("once holders are dropped, a new key got no holder, or was admitted past Max")
	}
}

// BenchmarkLocalQuotaNewKey is a decision on a key the engine has not seen: without local
// quota, and with it while no holders are kept and while maxLocalKeys holders are recent (each
// asked about within its last hold, none to drop), as after a flood of new keys. B/holder is
// the heap those holders take, each for a key of about 40 bytes.
func BenchmarkLocalQuotaNewKey(b *testing.B) {
	client := valkeytest.New(b).Client(b)
	l := Limit{Max: 1 << 20, Window: time.Hour}
	local := WithLocalQuota(LocalQuota{Hold: time.Minute}) // every holder stays recent throughout
	for _, tc := range []struct {
		name    string
		opts    []Option
		holders int
	}{
		{"without local quota", nil, 0},
		{"local quota, no holders", []Option{local}, 0},
		{"local quota, 100000 recent holders", []Option{local}, maxLocalKeys},
	} {
		b.Run(tc.name, func(b *testing.B) {
			e, err := New(client, tc.opts...)
			if err != nil {
				b.Fatal(err)
			}
			prefix := "bench:" + uuid.NewString() + ":"
			perHolder := 0.0
			if tc.holders > 0 {
				var before, after runtime.MemStats
				runtime.GC()
				runtime.ReadMemStats(&before)
				set := e.oneLimit(l)
				for i := range tc.holders {
					h := e.local.holder(prefix+"recent:"+strconv.Itoa(i), set)
					h.mu.Lock()
					h.noteDemand(time.Now(), 1, h.hold)
					h.mu.Unlock()
				}
				runtime.GC()
				runtime.ReadMemStats(&after)
				perHolder = float64(after.HeapAlloc-before.HeapAlloc) / float64(tc.holders)
			}
			ctx, i := context.Background(), 0
			for b.Loop() {
				if _, err := e.Allow(ctx, prefix+"new:"+strconv.Itoa(i), l); err != nil {
					b.Fatal(err)
				}
				i++
			}
			if perHolder > 0 {
				b.ReportMetric(perHolder, "B/holder")
			}
		})
	}
}
