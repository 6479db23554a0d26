package engine_test

import (
	"cmp"
	"context"
	"fmt"
	"math/rand/v2"
	"regexp"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/valkey-io/valkey-go"

	"github.com/strictrate/strictrate/engine"
	"github.com/strictrate/strictrate/inspect"
	"github.com/strictrate/strictrate/scripts"
)

// modelEntry is one admitted request in the model's log, or a run of refunded ones.
type modelEntry struct {
	at   int64 // µs
	seq  int   // the first seq it stands for
	span int   // how many seqs it stands for: 1, or more for a run of refunded entries
	cost int
	was  int // the cost it was admitted with
}

// modelLog is the sliding window log as the contract states it, computed the obvious way:
// every entry in a list, every count a sum over it. The engine must answer exactly as it does.
// horizon is the longest window any write counted on the key: the log keeps what it counts.
type modelLog struct {
	key     string // the log's name in Valkey, as an admission's EntryID carries it
	entries []modelEntry
	horizon int64
}

func (m *modelLog) trim(cutoff int64) {
	i := 0
	for i < len(m.entries) && m.entries[i].at <= cutoff {
		i++
	}
	m.entries = m.entries[i:]
}

// count is the events in window at now: entries after now-window, later than now included.
func (m *modelLog) count(now, window int64) int {
	sum := 0
	for _, e := range m.entries {
		if e.at > now-window {
			sum += e.cost
		}
	}
	return sum
}

// coverWalk is how many entries a decision reads from each end of a window to find when a
// denied request would be admitted (lib_log.lua's COVER_WALK: TestCoverWalkIsTheScripts).
const coverWalk = 32

// The model reads as far as the scripts do: lib_log.lua's COVER_WALK is coverWalk.
func TestCoverWalkIsTheScripts(t *testing.T) {
	m := regexp.MustCompile(`(?m)^--const COVER_WALK (\d+)$`).FindStringSubmatch(scripts.Source("decide", 0))
	if m == nil {
		t.Fatal("lib_log.lua defines no COVER_WALK")
	}
	if got, _ := strconv.Atoi(m[1]); got != coverWalk {
		t.Fatalf("lib_log.lua's COVER_WALK is %d, the model's %d", got, coverWalk)
	}
}

// covering is the time of the entry in window at which need events have been counted, oldest
// first, when it is among the coverWalk oldest or newest entries of the window; deeper, the
// time of the coverWalk-th oldest: the script reads no more, and says when the request is
// admitted at the earliest.
func (m *modelLog) covering(now, window int64, need int) int64 {
	var in []modelEntry
	for _, e := range m.entries {
		if e.at > now-window {
			in = append(in, e)
		}
	}
	sum := 0
	for i, e := range in {
		if sum += e.cost; sum >= need {
			if i >= coverWalk && i < len(in)-coverWalk {
				return in[coverWalk-1].at
			}
			return e.at
		}
	}
	panic("covering: not enough events")
}

func (m *modelLog) newest() int64 { return m.entries[len(m.entries)-1].at }

// quotaAfter is the wait until the first event in window leaves it: the oldest entry after
// now-window that still carries events (a refunded one carries none); 0 when there is none.
func (m *modelLog) quotaAfter(now int64, window time.Duration) time.Duration {
	w := micros(window)
	for _, e := range m.entries {
		if e.at > now-w && e.cost > 0 {
			return time.Duration(e.at+w-now) * time.Microsecond
		}
	}
	return 0
}

// decide is AllowPolicy (write) or Peek (read-only) in the model, limits ascending.
func (m *modelLog) decide(now int64, n int, limits []engine.Limit, write bool) engine.Result {
	longest := micros(limits[len(limits)-1].Window)
	if write {
		m.horizon = max(m.horizon, longest)
		m.trim(now - m.horizon)
	}
	reach := max(longest, m.horizon)
	remaining, tightest, retry := 0, 0, int64(0)
	for i, l := range limits {
		w := micros(l.Window)
		c := m.count(now, w)
		if i == 0 || l.Max-c < remaining {
			remaining, tightest = l.Max-c, i
		}
		if c+n > l.Max {
			retry = max(retry, m.covering(now, w, c+n-l.Max)+w-now)
		}
	}
	r := engine.Result{At: time.UnixMicro(now), Window: limits[tightest].Window}
	if retry > 0 {
		r.Remaining = max(remaining, 0)
		r.RetryAfter = time.Duration(retry) * time.Microsecond
		r.ResetAfter = time.Duration(m.newest()+reach-now) * time.Microsecond
		r.QuotaAfter = m.quotaAfter(now, r.Window)
		return r
	}
	r.Allowed = true
	if !write {
		r.Remaining = remaining
		if m.count(now, longest) > 0 {
			r.ResetAfter = time.Duration(m.newest()+reach-now) * time.Microsecond
		}
		r.QuotaAfter = m.quotaAfter(now, r.Window)
		return r
	}
	r.Remaining = remaining - n
	p, seq := len(m.entries), 1
	for i, e := range m.entries {
		if e.at > now {
			p = i
			break
		}
		if e.at == now {
			seq += e.span
		}
	}
	if p == len(m.entries) && p > 0 && m.entries[p-1].cost == 0 && m.entries[p-1].at < now {
		// A refunded run at the end leaves once a later microsecond is appended.
		m.entries = m.entries[:p-1]
		p--
	}
	m.entries = slices.Insert(m.entries, p, modelEntry{at: now, seq: seq, span: 1, cost: n, was: n})
	r.ResetAfter = time.Duration(m.newest()+reach-now) * time.Microsecond
	r.QuotaAfter = m.quotaAfter(now, r.Window)
	r.Entry = engine.EntryID{Key: m.key, At: r.At, Seq: seq, Cost: n}
	return r
}

// settle lowers the entry id names to actual; one refunded in full is then compacted: joined
// with the refunded entries of its microsecond beside it into one run, and the run taken out
// when it is the last entry of its microsecond and older than the newest entry.
func (m *modelLog) settle(id engine.EntryID, actual int) {
	for i := range m.entries {
		e := &m.entries[i]
		if e.at == id.At.UnixMicro() && id.Seq >= e.seq && id.Seq < e.seq+e.span && e.cost <= id.Cost {
			if actual >= e.cost {
				return
			}
			e.cost = actual
			if actual == 0 {
				m.compact(i)
			}
			return
		}
	}
}

func (m *modelLog) compact(i int) {
	es := m.entries
	if i+1 < len(es) && es[i+1].at == es[i].at && es[i+1].cost == 0 {
		es[i].span += es[i+1].span
		es = slices.Delete(es, i+1, i+2)
	}
	if i > 0 && es[i-1].at == es[i].at && es[i-1].cost == 0 {
		es[i-1].span += es[i].span
		es = slices.Delete(es, i, i+1)
		i--
	}
	if es[i].at < es[len(es)-1].at && (i+1 == len(es) || es[i+1].at > es[i].at) {
		es = slices.Delete(es, i, i+1)
	}
	m.entries = es
}

func micros(d time.Duration) int64 { return int64(d / time.Microsecond) }

// steppedClock is a caller's clock the test sets before each call.
type steppedClock struct{ now time.Time }

func (c *steppedClock) Now() time.Time { return c.now }

// Thousands of random operations on a few keys, with callers' clocks that jump forward, lag
// behind each other and stand still, single limits and policies of up to four windows on the
// same key, costs from 1 to Max, peeks, refunds and settles (retried, and of entries long
// gone), and 20 different windows on one key (more than the log keeps cursors for): every
// Result field equals the model's, and the stored log holds the model's entries. Seeds past 12
// keep to one window, so that the log never holds a cursor and the fast path (one limit, a
// short log) decides most requests.
func TestLogAgainstModel(t *testing.T) {
	client := exampleClient()
	defer client.Close()
	clock := &steppedClock{}
	e, err := engine.New(client, engine.WithClock(clock.Now))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for seed := uint64(1); seed <= 15; seed++ {
		// Seeds past 6 keep logs long (larger limits, smaller steps), so that the log's oldest
		// entries move behind its header and back out.
		long, oneWindow := seed > 6 && seed <= 12, seed > 12
		t.Run(fmt.Sprint("seed ", seed), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, 42))
			step, maxes, ops := int64(400_000), 30, 700
			if long {
				step, maxes, ops = 40_000, 300, 1500
			}
			longest := 0
			key := exampleKey(fmt.Sprint("model-", seed))
			model := &modelLog{key: "strictrate:" + key}
			base := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC).UnixMicro()
			now := base
			// The windows this key sees: a few common ones, and now and then a rare one.
			windows := []time.Duration{2 * time.Second, 3 * time.Second, 5 * time.Second, 8 * time.Second}
			var admitted []engine.Result
			for op := 0; op < ops; op++ {
				switch k := rng.IntN(100); {
				case k < 55:
					now += rng.Int64N(step) // forward
				case k < 70 && !long, k < 62:
					now -= rng.Int64N(4 * step) // a caller behind the others
				case k < 72 && !long:
					now += 4_000_000 // a pause: most entries leave
				}
				clock.now = time.UnixMicro(now)
				var limits []engine.Limit
				count := 1 + rng.IntN(4)
				if long {
					count = 1 + rng.IntN(2)
				}
				pool := slices.Clone(windows)
				if oneWindow {
					count, pool = 1, pool[1:2]
				} else if seed%2 == 0 && rng.IntN(10) == 0 {
					pool = append(pool, time.Duration(1+rng.IntN(20))*time.Second+time.Duration(op)*time.Microsecond)
				}
				rng.Shuffle(len(pool), func(i, j int) { pool[i], pool[j] = pool[j], pool[i] })
				for _, w := range pool[:min(count, len(pool))] {
					limits = append(limits, engine.Limit{Max: maxes/3 + rng.IntN(maxes), Window: w})
				}
				slices.SortFunc(limits, func(a, b engine.Limit) int { return cmp.Compare(a.Window, b.Window) })
				smallest := slices.MinFunc(limits, func(a, b engine.Limit) int { return cmp.Compare(a.Max, b.Max) }).Max
				n := 1 + rng.IntN(smallest)
				if rng.IntN(3) > 0 {
					n = 1 + rng.IntN(min(3, smallest))
				}

				var got, want engine.Result
				what := ""
				switch k := rng.IntN(100); {
				case k < 12:
					what = fmt.Sprintf("Peek %v at +%dµs", limits, now-base)
					if len(limits) == 1 {
						got, err = e.Peek(ctx, key, limits[0])
						want = model.decide(now, 1, limits, false)
					} else {
						continue
					}
				case k < 24 && len(admitted) > 0:
					r := admitted[rng.IntN(len(admitted))]
					actual := rng.IntN(r.Entry.Cost + 1)
					if rng.IntN(2) == 0 {
						actual = 0
					}
					if err := e.Settle(ctx, key, r, actual); err != nil {
						t.Fatalf("op %d: Settle(%+v, %d): %v", op, r.Entry, actual, err)
					}
					model.settle(r.Entry, actual)
					continue
				default:
					what = fmt.Sprintf("AllowPolicy(%v, %d) at +%dµs", limits, n, now-base)
					if len(limits) == 1 && rng.IntN(2) == 0 {
						got, err = e.AllowN(ctx, key, limits[0], n)
					} else {
						got, err = e.AllowPolicy(ctx, key, engine.Policy(limits), n)
					}
					want = model.decide(now, n, limits, true)
				}
				if err != nil {
					t.Fatalf("op %d: %s: %v", op, what, err)
				}
				if got != want {
					checkStored(t, client, key, model)
					t.Fatalf("op %d: %s:\n got %+v\nwant %+v", op, what, got, want)
				}
				if got.Allowed && !got.Entry.IsZero() {
					admitted = append(admitted, got)
				}
				longest = max(longest, len(model.entries))
				if op%50 == 0 {
					checkStored(t, client, key, model)
				}
			}
			checkStored(t, client, key, model)
			if long && longest < 64 {
				t.Fatalf("the longest log held %d entries: too short to leave the header", longest)
			}
		})
	}
}

// checkStored compares the log Inspect reads with the model's entries.
func checkStored(t *testing.T, c valkey.Client, key string, m *modelLog) {
	t.Helper()
	log, err := inspect.Read(context.Background(), c, "strictrate:"+key, 0)
	if err != nil {
		t.Fatal(err)
	}
	var want []inspect.Entry
	events := 0
	for _, me := range m.entries {
		want = append(want, inspect.Entry{At: time.UnixMicro(me.at), Cost: me.cost})
		events += me.cost
	}
	if fmt.Sprint(log.Entries) != fmt.Sprint(want) || log.Events != events || log.Count != len(want) {
		t.Fatalf("stored log: %d events, %d entries %v\nmodel: %d events, %d entries %v", log.Events, log.Count, log.Entries, events, len(want), want)
	}
}
