package engine

import (
	"hash/maphash"
	"slices"
	"sync"
	"sync/atomic"
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
//
// A give-back and a denial in flight at once are ordered by the key's epoch: forget moves it
// on, before the give-back is sent and again once it came back, and a denial is stored only
// if its key's epoch is the one read before its call was sent. So a denial decided before a
// give-back, whose reply lands after it, is never stored; and one stored while the give-back
// was in flight (decided before it) is dropped once it comes back. Epochs are kept per stripe
// of keys (a key's hash picks one), so that their memory stays fixed: a give-back on a key
// drops the denials in flight of the keys of its stripe too, which costs those a round trip.
type denyCache struct {
	keys    *lru.Cache[string, *keyDenials] // by full key, least recently used out first
	seed    maphash.Seed
	stripes [denyStripes]denyStripe
}

// denyStripes is how many epochs a deny cache keeps: a few kilobytes, and a give-back drops
// one key's in two hundred and fifty-six denials in flight.
const denyStripes = 256

// denyStripe is the epoch of the keys whose hash picks it; mu orders forget and store.
type denyStripe struct {
	mu    sync.Mutex
	epoch atomic.Uint64
}

// stripe is key's stripe.
func (c *denyCache) stripe(key string) *denyStripe {
	return &c.stripes[maphash.String(c.seed, key)%denyStripes]
}

// epoch is key's epoch now: read it before the call whose denial store is given.
func (c *denyCache) epoch(key string) uint64 { return c.stripe(key).epoch.Load() }

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
	return &denyCache{keys: keys, seed: maphash.MakeSeed()}, nil
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
// returned (readings of the engine's clock), its call sent when key's epoch was epoch; it
// replaces the key's earlier denial on set. A denial whose key was given events back since
// (its epoch moved on) is not stored: it may be stale.
func (c *denyCache) store(key string, set *limitSet, n int, r Result, sent, returned time.Time, epoch uint64) {
	s := c.stripe(key)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.epoch.Load() != epoch {
		return
	}
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

// forget drops key's cached denials and moves its epoch on: events may have been given back
// to it, so no denial in flight may be stored.
func (c *denyCache) forget(key string) {
	s := c.stripe(key)
	s.mu.Lock()
	s.epoch.Add(1)
	c.keys.Remove(key)
	s.mu.Unlock()
}

// forgetDenials drops the deny cache's denials of the full key, to which events may be given
// back: call it before the give-back is sent, and again once it came back (giveBack).
func (e *Engine) forgetDenials(fullKey string) {
	if e.denials != nil {
		e.denials.forget(fullKey)
	}
}

// givingBack forgets the full key's denials for a give-back (Reset, Refund, Settle) about to
// be sent, and returns what to call once it came back, whatever its outcome: a denial decided
// before the give-back may have been stored meanwhile.
func (e *Engine) givingBack(fullKey string) (done func()) {
	e.forgetDenials(fullKey)
	return func() { e.forgetDenials(fullKey) }
}
