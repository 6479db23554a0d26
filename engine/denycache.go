package engine

import (
	"slices"
	"sync"
	"time"

	lru "github.com/hashicorp/golang-lru/v2"
)

// denyCache remembers recent denials (WithDenyCache), so that a key under abuse is refused
// without a round trip. A denial says that the same request, or a costlier one, on the same
// limits, cannot be admitted before its RetryAfter has run; counted from the moment the
// denied call was sent, which precedes the server's decision, a cached denial never outlives
// the real one. Room can come back sooner only through Reset, Refund or Settle: through this
// engine they clear the key's denials; through another process they do not, which is the
// cache's one inexactness (a later request may be refused until the RetryAfter runs out).
type denyCache struct {
	keys *lru.Cache[string, *keyDenials] // by full key, least recently used out first
}

// keyDenials are one key's cached denials, one per limit set.
type keyDenials struct {
	mu   sync.Mutex
	list []denial
}

// denial is a denied request's limits, cost and Result, and the engine clock's readings of
// when the call was sent (until is that plus RetryAfter) and when the denial came back.
type denial struct {
	set      *limitSet
	n        int
	until    time.Time
	returned time.Time
	r        Result
}

func newDenyCache(entries int) (*denyCache, error) {
	keys, err := lru.New[string, *keyDenials](entries)
	if err != nil {
		return nil, err
	}
	return &denyCache{keys: keys}, nil
}

// lookup returns the cached denial of a request for n events of key against set at now, with
// RetryAfter counted down and At moved on by the time since it came back (never before the
// denial's own At); false when none holds.
func (c *denyCache) lookup(key string, set *limitSet, n int, now time.Time) (Result, bool) {
	kd, ok := c.keys.Get(key)
	if !ok {
		return Result{}, false
	}
	kd.mu.Lock()
	defer kd.mu.Unlock()
	for i, d := range kd.list {
		if !d.set.sameLimits(set) {
			continue
		}
		if !now.Before(d.until) {
			kd.list = append(kd.list[:i], kd.list[i+1:]...)
			return Result{}, false
		}
		if n < d.n {
			return Result{}, false
		}
		// now may precede returned: the request's clock was read before another caller stored
		// this denial. The denial's At is then the best reading of the server's clock.
		elapsed := max(now.Sub(d.returned), 0)
		r := d.r
		r.RetryAfter = d.until.Sub(now)
		r.ResetAfter = max(r.ResetAfter-elapsed, r.RetryAfter)
		r.QuotaAfter = max(r.QuotaAfter-elapsed, 0)
		r.At = r.At.Add(elapsed)
		r.FromCache = true
		return r, true
	}
	return Result{}, false
}

// store remembers a denial of n events of key against set, sent at sent and come back at
// returned (readings of the engine's clock); it replaces the key's earlier denial on set.
func (c *denyCache) store(key string, set *limitSet, n int, r Result, sent, returned time.Time) {
	d := denial{set: set, n: n, until: sent.Add(r.RetryAfter), returned: returned, r: r}
	kd, ok := c.keys.Get(key)
	if !ok {
		kd = &keyDenials{}
		if prev, loaded, _ := c.keys.PeekOrAdd(key, kd); loaded {
			kd = prev
		}
	}
	kd.mu.Lock()
	defer kd.mu.Unlock()
	for i := range kd.list {
		if kd.list[i].set.sameLimits(set) {
			kd.list[i] = d
			return
		}
	}
	// Denials that ran out go first; then, past the bound, the oldest stored: a program that
	// asks one key with ever new limits keeps a few of them, not all.
	kd.list = slices.DeleteFunc(kd.list, func(old denial) bool { return !sent.Before(old.until) })
	if len(kd.list) >= maxDenialsPerKey {
		kd.list = append(kd.list[:0], kd.list[len(kd.list)-maxDenialsPerKey+1:]...)
	}
	kd.list = append(kd.list, d)
}

// maxDenialsPerKey bounds the denials the cache keeps for one key, one per limit set: as many
// as a policy may hold limits, so one key's state stays a few kilobytes however many
// different limits are asked of it.
const maxDenialsPerKey = MaxPolicyLimits

// forget drops key's cached denials: events may have been given back to it.
func (c *denyCache) forget(key string) { c.keys.Remove(key) }

// forgetDenials drops the deny cache's denials of the full key, to which events may have been
// given back.
func (e *Engine) forgetDenials(fullKey string) {
	if e.denials != nil {
		e.denials.forget(fullKey)
	}
}
