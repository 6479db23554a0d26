// The helpers the engine's external tests share, beside the code each test file tests: the
// package's one server (TestMain), readings of what a server holds and ran, servers killed,
// replicated and clustered, audits of concurrent decisions on their server timestamps, lease
// calls that fail the test, and the model of the log that decide_test.go and limit_test.go
// check the scripts against. A helper one test file alone uses stays in that file.

package engine_test

import (
	"bufio"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/valkey-io/valkey-go"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/strictrate/strictrate/engine"
	"github.com/strictrate/strictrate/inspect"
	"github.com/strictrate/strictrate/internal/enginetest"
	"github.com/strictrate/strictrate/internal/valkeytest"
)

// The package's one server, which the examples find in VALKEY_ADDR: each example connects as
// a program would, with a client of its own, and keys its counts by a UUID, so that its Output
// is the same on every run whatever the server holds.

// exampleServer is the Valkey the package's tests share, started by TestMain.
var exampleServer *valkeytest.Server

func TestMain(m *testing.M) {
	os.Exit(valkeytest.RunWithServer(m, func(s *valkeytest.Server) {
		exampleServer = s
		// The examples find the server where a reader's copy of them would: in VALKEY_ADDR.
		// Tests that need a server of their own ask for one with valkeytest.OwnServer.
		os.Setenv(valkeytest.EnvAddr, s.Addr)
	}))
}

// exampleClient connects to the tests' server, for tests; the examples connect on their own.
func exampleClient() valkey.Client {
	c, err := valkey.NewClient(valkey.ClientOption{InitAddress: []string{exampleServer.Addr}})
	if err != nil {
		panic(err)
	}
	return c
}

// exampleKey is a key no other run uses, so that a test's counts start from nothing.
func exampleKey(name string) string { return "example:" + name + ":" + uuid.NewString() }

// What a server holds and ran.

// scriptCalls reads how many times each decision script ran on c's server (INFO commandstats
// counts EVALSHA and EVAL together per name; the batch script and the single one share it),
// and the decisions they carried are what the test counts itself.
func scriptCalls(t *testing.T, c valkey.Client) int64 {
	t.Helper()
	info, err := valkeytest.ReadInfo(context.Background(), c, "commandstats")
	if err != nil {
		t.Fatal(err)
	}
	stats := info.CommandStats()
	return stats["evalsha"].Calls + stats["eval"].Calls
}

func resetStats(t *testing.T, c valkey.Client) {
	t.Helper()
	if err := c.Do(context.Background(), c.B().ConfigResetstat().Build()).Error(); err != nil {
		t.Fatal(err)
	}
}

// commandStats reads a node's INFO commandstats.
func commandStats(t *testing.T, n *valkeytest.Node) map[string]valkeytest.CommandStat {
	t.Helper()
	info, err := valkeytest.ReadInfo(context.Background(), n.Client(), "commandstats")
	if err != nil {
		t.Fatalf("%s: %v", n.Addr, err)
	}
	return info.CommandStats()
}

// onEvery sends the command build makes to each node, on its own client, and fails t on an error.
func onEvery(t *testing.T, nodes []*valkeytest.Node, build func(valkey.Builder) valkey.Completed) {
	t.Helper()
	for _, n := range nodes {
		c := n.Client()
		if err := c.Do(context.Background(), build(c.B())).Error(); err != nil {
			t.Fatalf("%s: %v", n.Addr, err)
		}
	}
}

// memoryUsage is MEMORY USAGE of key's log, in bytes.
func memoryUsage(t *testing.T, c valkey.Client, key string) int64 {
	t.Helper()
	size, err := c.Do(context.Background(), c.B().MemoryUsage().Key(enginetest.Prefix+key).Samples(0).Build()).AsInt64()
	if err != nil {
		t.Fatalf("MEMORY USAGE: %v", err)
	}
	return size
}

// keyState is what a key holds, as the server serializes it (DUMP; "" for no key), and its
// expiry in milliseconds (PTTL): enough to tell whether a call touched it.
type keyState struct {
	dump string
	pttl int64
}

func stateOf(t *testing.T, c valkey.Client, full string) keyState {
	t.Helper()
	ctx := context.Background()
	dump, err := c.Do(ctx, c.B().Dump().Key(full).Build()).ToString()
	if valkey.IsValkeyNil(err) {
		dump, err = "", nil
	}
	if err != nil {
		t.Fatalf("DUMP %s: %v", full, err)
	}
	return keyState{dump: dump, pttl: enginetest.PTTL(t, c, full)}
}

// wantUntouched fails t unless full holds what it held (before), with the expiry it had: no
// later than before (a write would have set it anew) and within a second of it.
func wantUntouched(t *testing.T, c valkey.Client, what, full string, before keyState) {
	t.Helper()
	after := stateOf(t, c, full)
	if after.dump != before.dump {
		t.Errorf("%s changed what %s holds, want it untouched", what, full)
	}
	if after.pttl > before.pttl || before.pttl >= 0 && after.pttl < before.pttl-1000 || (before.pttl < 0) != (after.pttl < 0) {
		t.Errorf("%s moved %s's expiry: PTTL %d, then %d; want it untouched", what, full, before.pttl, after.pttl)
	}
}

// containsAll reports whether s contains every one of subs.
func containsAll(s string, subs ...string) bool {
	for _, sub := range subs {
		if !strings.Contains(s, sub) {
			return false
		}
	}
	return true
}

func mustAtoi(t *testing.T, s string) int64 {
	t.Helper()
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// Servers killed, replicated and clustered.

// crashAndRestart kills the server with SIGKILL, starts it again on the same files, and waits
// until e decides again.
func crashAndRestart(t *testing.T, own *valkeytest.Server, e *engine.Engine) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := own.Crash(); err != nil {
		t.Fatal(err)
	}
	if err := own.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	// The probe is a decision, not a peek: valkey-go sends a read-only call that a dying
	// connection failed again on a new connection while the old one's writer may still be
	// writing it, and then recycles its memory for the next command, which the race detector
	// reports as a race inside valkey-go (not in this module). A write is never sent twice.
	probe := "restarted:" + uuid.NewString()
	if err := valkeytest.WaitFor(ctx, 10*time.Second, "the restarted server to decide", func() (bool, error) {
		pctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		_, err := e.Allow(pctx, probe, engine.PerMinute(1<<20))
		return err == nil, nil
	}); err != nil {
		t.Fatal(err)
	}
}

// replicaOf starts a server of its own as a replica of primary, waits until primary counts it
// online, and returns its client. The primary starts the sync at once instead of after its
// default 5 seconds (repl-diskless-sync-delay).
func replicaOf(t *testing.T, primary *valkeytest.Server) valkey.Client {
	t.Helper()
	replica := valkeytest.New(t, valkeytest.OwnServer())
	ctx := context.Background()
	pc := primary.Client(t)
	if err := pc.Do(ctx, pc.B().ConfigSet().ParameterValue().ParameterValue("repl-diskless-sync-delay", "0").Build()).Error(); err != nil {
		t.Fatal(err)
	}
	rc := replica.Client(t)
	host, port, _ := strings.Cut(primary.Addr, ":")
	if err := rc.Do(ctx, rc.B().Replicaof().Host(host).Port(mustAtoi(t, port)).Build()).Error(); err != nil {
		t.Fatal(err)
	}
	if err := valkeytest.WaitFor(ctx, 10*time.Second, "the replica to be online", func() (bool, error) {
		info, err := valkeytest.ReadInfo(ctx, pc, "replication")
		return strings.Contains(info["slave0"], "state=online"), err
	}); err != nil {
		t.Fatal(err)
	}
	return rc
}

// keyOn returns a fresh user key whose full key (with the engine's prefix) lands in node's
// slots.
func keyOn(t *testing.T, node *valkeytest.Node) string {
	t.Helper()
	return keyUnder(t, node, enginetest.Prefix)
}

// leaseKeyOn returns a fresh user key whose lease set lands in node's slots.
func leaseKeyOn(t *testing.T, node *valkeytest.Node) string {
	t.Helper()
	return keyUnder(t, node, enginetest.Prefix+engine.LeaseNamespace)
}

// keyUnder returns a fresh user key that, after full (a prefix), lands in node's slots.
func keyUnder(t *testing.T, node *valkeytest.Node, full string) string {
	t.Helper()
	for i := 0; i < 10_000; i++ {
		if key := uuid.NewString(); node.Owns(full + key) {
			return key
		}
	}
	t.Fatalf("no key found for slots %d-%d", node.First, node.Last)
	return ""
}

// clusterEngines returns n engines with batching on, each on a cluster client of its own,
// made with opts.
func clusterEngines(t *testing.T, c *valkeytest.Cluster, n int, opts ...engine.Option) []*engine.Engine {
	t.Helper()
	var es []*engine.Engine
	for i := 0; i < n; i++ {
		es = append(es, enginetest.New(t, c.Client(t, valkey.ClientOption{}), append([]engine.Option{engine.WithBatching(true)}, opts...)...))
	}
	return es
}

// Decisions, and audits of concurrent ones on the times the server took them.

// fillAll admits one event at a time on every key until l denies, and returns how many it admitted.
func fillAll(t *testing.T, e *engine.Engine, keys []string, l engine.Limit) int {
	t.Helper()
	admitted := 0
	for _, key := range keys {
		for enginetest.MustAllowN(t, e, key, l, 1).Allowed {
			admitted++
		}
	}
	return admitted
}

// weightedDecision is one decision of the weighted audit: when the server took it, its cost,
// and whether it was admitted.
type weightedDecision struct {
	at      int64 // µs, the server's clock
	cost    int
	allowed bool
	cached  bool // answered by the deny cache
}

// auditWeighted checks decisions against the limit on their server timestamps: no trailing
// window holds more than Max of admitted cost (at or before each admission, the admission
// included), and no request was denied while its trailing window had room for it (admitted
// cost strictly before it in the window, plus its cost, at most Max; decisions of the same
// microsecond count as before it, the benefit of the doubt going to the denial).
func auditWeighted(t *testing.T, ds []weightedDecision, l engine.Limit) (admitted int) {
	t.Helper()
	w := l.Window.Microseconds()
	var times []int64 // the admitted decisions' times, ascending, and their running cost
	var cum []int
	slices.SortStableFunc(ds, func(a, b weightedDecision) int { return cmp.Compare(a.at, b.at) })
	for _, d := range ds {
		if d.allowed {
			times = append(times, d.at)
			cum = append(cum, admitted+d.cost)
			admitted += d.cost
		}
	}
	// costIn is the admitted cost in (t - w, t]: this microsecond included.
	costIn := func(t int64) int {
		upto, _ := slices.BinarySearchFunc(times, t+1, cmp.Compare[int64])
		from, _ := slices.BinarySearchFunc(times, t-w+1, cmp.Compare[int64])
		total := 0
		if upto > 0 {
			total = cum[upto-1]
		}
		if from > 0 {
			total -= cum[from-1]
		}
		return total
	}
	for _, d := range ds {
		inWindow := costIn(d.at)
		switch {
		case d.allowed && inWindow > l.Max:
			t.Fatalf("admitted cost %d in the window ending at %d, over Max %d", inWindow, d.at, l.Max)
		case !d.allowed && inWindow+d.cost <= l.Max:
			t.Fatalf("cost %d denied at %d with %d admitted in its window of Max %d: a false denial", d.cost, d.at, inWindow, l.Max)
		}
	}
	return admitted
}

// hammer runs do from goroutines spread over es (decideMany: each calls each at least, for
// span at least) and returns every decision (its timestamp, cost and outcome) and how many the
// deny cache took.
func hammer(t *testing.T, es []*engine.Engine, goroutines, each int, span time.Duration,
	do func(rng *rand.Rand, e *engine.Engine) (engine.Result, int, error)) (ds []weightedDecision, cached int) {
	t.Helper()
	ds = decideMany(t, es, goroutines, runFor{calls: each, span: span}, 9, func(rng *rand.Rand, e *engine.Engine) (weightedDecision, time.Time, error) {
		r, n, err := do(rng, e)
		return weightedDecision{at: r.At.UnixMicro(), cost: n, allowed: r.Allowed, cached: r.FromCache}, r.At, err
	})
	for _, d := range ds {
		if d.cached {
			cached++
		}
	}
	return ds, cached
}

// runFor is how long decideMany's goroutines go on: each makes at least calls calls, and goes
// on until the calls span span on the clock that took them (es must decide on the server's,
// which moves), and until more, when set, says the run has seen what its test needs. That is
// a fixed amount of work however busy the machine, over several windows however fast it is,
// and what the test's checks need however the machine's stalls fall. Nothing asserts a speed:
// a busy machine takes longer, the benchmarks measure how fast, and the audit of what was
// decided is the same.
type runFor struct {
	calls int
	span  time.Duration
	more  func() bool
}

// decideBound ends a run that never gets what runFor asks (each goroutine stops at its next
// call past it; the test's own checks then say what is missing): far beyond what a busy
// machine takes, well short of go test's timeout.
const decideBound = time.Minute

// decideMany runs do from goroutines spread over es, all let go at once, each with a random
// source of its own (seeded by the goroutine and seed), for as long as until says, and returns
// what every call returned.
func decideMany[D any](t *testing.T, es []*engine.Engine, goroutines int, until runFor, seed uint64,
	do func(rng *rand.Rand, e *engine.Engine) (D, time.Time, error)) []D {
	t.Helper()
	var (
		mu    sync.Mutex
		ds    []D
		first atomic.Int64 // the first call's time in µs; 0 until one returns
		wg    sync.WaitGroup
		errs  = make(chan error, goroutines)
		start = make(chan struct{})
	)
	began := time.Now()
	enough := func(done int, at int64) bool {
		return done >= until.calls && at-first.Load() >= until.span.Microseconds() && (until.more == nil || !until.more()) ||
			time.Since(began) > decideBound
	}
	for g := 0; g < goroutines; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(g), seed))
			e := es[g%len(es)]
			<-start
			for done, at := 0, int64(0); !enough(done, at); done++ {
				d, when, err := do(rng, e)
				if err != nil {
					errs <- err
					return
				}
				at = when.UnixMicro()
				first.CompareAndSwap(0, at)
				mu.Lock()
				ds = append(ds, d)
				mu.Unlock()
			}
		}()
	}
	close(start)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	return ds
}

// wantLimitReached fails t unless ds, audited (admitted events, by auditWeighted), admitted at
// least least events and denied one: a denial the audit found owed shows that a window held
// all the limit had room for, so the audit checked the limit where it binds. How many windows
// filled is the machine's speed, not asserted (the benchmarks measure it).
func wantLimitReached(t *testing.T, ds []weightedDecision, admitted, least int) {
	t.Helper()
	denied := 0
	for _, d := range ds {
		if !d.allowed {
			denied++
		}
	}
	t.Logf("%d decisions: %d events admitted, %d requests denied", len(ds), admitted, denied)
	if admitted < least || denied == 0 {
		t.Fatalf("%d events admitted and %d requests denied, want at least %d and 1: the limit was never reached, the audit proves little", admitted, denied, least)
	}
}

// auditTimestamps fails t when some trailing window of l holds more than l.Max of times (each
// one event), which it sorts.
func auditTimestamps(t *testing.T, times []time.Time, l engine.Limit) {
	t.Helper()
	slices.SortFunc(times, time.Time.Compare)
	first := 0
	for i, at := range times {
		for !times[first].After(at.Add(-l.Window)) {
			first++
		}
		if held := i - first + 1; held > l.Max {
			t.Fatalf("%d admissions in the %s up to %s, want at most Max %d", held, l.Window, at, l.Max)
		}
	}
}

// collected reads every metric point the reader has: a counter's value, or a histogram's count
// of recordings, by metric name and its attributes "operation/outcome" (or "operation", or
// local quota's kind of events).
func collected(t *testing.T, reader *sdkmetric.ManualReader) map[string]map[string]int64 {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	label := func(set attribute.Set) string {
		if kind, ok := set.Value("strictrate.local"); ok {
			return kind.AsString()
		}
		op, _ := set.Value("strictrate.operation")
		s := op.AsString()
		if oc, ok := set.Value("strictrate.outcome"); ok {
			s += "/" + oc.AsString()
		}
		return s
	}
	out := map[string]map[string]int64{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			points := map[string]int64{}
			switch data := m.Data.(type) {
			case metricdata.Sum[int64]:
				for _, p := range data.DataPoints {
					points[label(p.Attributes)] = p.Value
				}
			case metricdata.Histogram[float64]:
				for _, p := range data.DataPoints {
					points[label(p.Attributes)] = int64(p.Count)
				}
			case metricdata.Histogram[int64]:
				for _, p := range data.DataPoints {
					points[label(p.Attributes)] = int64(p.Count)
				}
			}
			out[m.Name] = points
		}
	}
	return out
}

// Lease calls that fail the test.

// leaseKey is the full name of key's lease set under the tests' prefix.
func leaseKey(key string) string { return enginetest.Prefix + engine.LeaseNamespace + key }

func mustAcquire(t *testing.T, e *engine.Engine, key string, max int, ttl time.Duration) engine.Lease {
	t.Helper()
	l, err := e.Acquire(context.Background(), key, max, ttl)
	if err != nil {
		t.Fatalf("Acquire(%q, max %d, ttl %s): %v", key, max, ttl, err)
	}
	if l.ID == uuid.Nil || l.Key != key || l.BackendErr != nil {
		t.Fatalf("Acquire granted %+v: want a lease of %q with an id", l, key)
	}
	return l
}

// mustDeny acquires and wants a denial; it returns the denial's times as a Result: At, the
// wait until the soonest lease expires (RetryAfter) and until the last one does (ResetAfter).
func mustDeny(t *testing.T, e *engine.Engine, key string, max int, ttl time.Duration) engine.Result {
	t.Helper()
	l, err := e.Acquire(context.Background(), key, max, ttl)
	var denied *engine.LeaseDeniedError
	if !errors.As(err, &denied) || !errors.Is(err, engine.ErrRateLimitExceeded) {
		t.Fatalf("Acquire(%q, max %d) = %+v, %v; want a *LeaseDeniedError matching ErrRateLimitExceeded", key, max, l, err)
	}
	if denied.Key != key || denied.Max != max || denied.Holders < max || denied.RetryAfter() <= 0 || denied.LastExpiry.Before(denied.NextExpiry) {
		t.Fatalf("denial %+v: want key %q, max %d, at least that many holders and a positive RetryAfter", denied, key, max)
	}
	return engine.Result{At: denied.At, RetryAfter: denied.RetryAfter(), ResetAfter: denied.LastExpiry.Sub(denied.At)}
}

func mustRelease(t *testing.T, e *engine.Engine, l engine.Lease) {
	t.Helper()
	if err := e.Release(context.Background(), l); err != nil {
		t.Fatalf("Release(%s): %v", l.ID, err)
	}
}

// leaseCount is how many leases key's set holds, expired ones not dropped yet included.
func leaseCount(t *testing.T, c valkey.Client, key string) int64 {
	t.Helper()
	return valkeytest.Must(t, "ZCARD", c.Do(context.Background(), c.B().Zcard().Key(leaseKey(key)).Build()), valkey.ValkeyResult.AsInt64)
}

// holderAudit is what auditHolders saw.
type holderAudit struct {
	peak, denials, through int64
}

// auditHolders runs goroutines over the engines, each taking a slot of key (max at once)
// rounds times: acquire, raise a counter of holders, hold a random 1-10 ms, lower the counter,
// release. A denied goroutine waits the denial's RetryAfter or a few milliseconds, whichever
// is shorter (a release frees a slot sooner than an expiry), and tries again. It returns the
// most holders the counter saw at once, the denials, and how many goroutines got through
// every round before ctx's deadline.
func auditHolders(t *testing.T, ctx context.Context, es []*engine.Engine, key string, max, goroutines, rounds int) holderAudit {
	t.Helper()
	var (
		holders, peak, denials, through atomic.Int64
		wg                              sync.WaitGroup
		errs                            = make(chan error, goroutines)
		start                           = make(chan struct{})
	)
	for g := 0; g < goroutines; g++ {
		e := es[g%len(es)]
		rng := rand.New(rand.NewPCG(uint64(g), 12))
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			for done := 0; done < rounds; {
				l, err := e.Acquire(ctx, key, max, 10*time.Second)
				if denied := (*engine.LeaseDeniedError)(nil); errors.As(err, &denied) {
					denials.Add(1)
					pause := min(denied.RetryAfter(), time.Duration(1+rng.IntN(4))*time.Millisecond)
					select {
					case <-ctx.Done():
						errs <- fmt.Errorf("goroutine %d: %d of %d rounds before the deadline", g, done, rounds)
						return
					case <-time.After(pause):
					}
					continue
				}
				if err != nil {
					errs <- err
					return
				}
				n := holders.Add(1)
				for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
				}
				time.Sleep(time.Duration(1+rng.IntN(10)) * time.Millisecond)
				holders.Add(-1)
				if err := e.Release(ctx, l); err != nil {
					errs <- err
					return
				}
				done++
			}
			through.Add(1)
		}()
	}
	close(start)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	return holderAudit{peak: peak.Load(), denials: denials.Load(), through: through.Load()}
}

// The model of the log: the contract written out the obvious way, which TestLogAgainstModel
// (decide_test.go) and TestResolutionAgainstModel (limit_test.go) check every Result against.

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
	// weighted is the latest time of an entry that ever cost other than 1 since the log last
	// emptied: the script's last_weighted is at most this (and at least the latest such
	// entry's that still costs other than 1: weightedNow).
	weighted int64
	// deepExact counts the denials whose exact wait lies deeper than the script walks, which
	// the script reads exactly on a unit log.
	deepExact int
}

// noTime stands for "no entry", below every time (lib_log.lua's NO_TIME_BEFORE).
const noTime = -(1 << 54)

// weigh notes that the entry of time at costs cost.
func (m *modelLog) weigh(at int64, cost int) {
	if cost != 1 {
		m.weighted = max(m.weighted, at)
	}
}

// weightedNow is the latest time of a live entry that costs other than 1.
func (m *modelLog) weightedNow() int64 {
	w := int64(noTime)
	for _, e := range m.entries {
		if e.cost != 1 {
			w = max(w, e.at)
		}
	}
	return w
}

// unit reports whether the script reads the log as a unit log (every entry of cost 1), and
// whether that is sure: it does when its last_weighted is before the oldest
// entry, and last_weighted lies between weightedNow and weighted, depending on how the log
// was stored (a small header's is recomputed from its entries).
func (m *modelLog) unit() (unit, sure bool) {
	if len(m.entries) == 0 {
		return false, true
	}
	oldest := m.entries[0].at
	switch {
	case m.weighted < oldest:
		return true, true
	case m.weightedNow() >= oldest:
		return false, true
	}
	return false, false
}

func (m *modelLog) trim(cutoff int64) {
	i := 0
	for i < len(m.entries) && m.entries[i].at <= cutoff {
		i++
	}
	m.entries = m.entries[i:]
	if i > 0 && len(m.entries) == 0 {
		m.weighted = noTime // the script deletes the key, and makes it anew
	}
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

// covering is the time of the entry in window at which need events have been counted, oldest
// first (exact), and what the script answers when it walks (walked): the same when the entry
// is among the coverWalk oldest or newest entries of the window; deeper, the time of the
// coverWalk-th oldest: the script reads no more, and says when the request is admitted at the
// earliest. On a unit log the script answers exact.
func (m *modelLog) covering(now, window int64, need int) (exact, walked int64) {
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
				return e.at, in[coverWalk-1].at
			}
			return e.at, e.at
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

// judge counts the limits at now for a request of n, on a log whose entries last reach: r
// holds the tightest limit's window, remaining the fewest events any limit has left; when
// some limit denies (denied), r is the denial, and alt its other answer when the model cannot
// tell whether the script reads the log as a unit log (unit).
func (m *modelLog) judge(now int64, n int, limits []engine.Limit, reach int64) (r engine.Result, alt *engine.Result, remaining int, denied bool) {
	unit, sure := m.unit()
	tightest, retry, exactRetry := 0, int64(0), int64(0)
	for i, l := range limits {
		w := micros(l.Window)
		c := m.count(now, w)
		if i == 0 || l.Max-c < remaining {
			remaining, tightest = l.Max-c, i
		}
		if c+n > l.Max {
			exact, walked := m.covering(now, w, c+n-l.Max)
			if unit && walked != exact {
				walked = exact
				m.deepExact++
			}
			retry = max(retry, walked+w-now)
			exactRetry = max(exactRetry, exact+w-now)
		}
	}
	r = engine.Result{At: time.UnixMicro(now), Window: limits[tightest].Window}
	if retry == 0 {
		return r, nil, remaining, false
	}
	r.Remaining = max(remaining, 0)
	r.RetryAfter = time.Duration(retry) * time.Microsecond
	r.ResetAfter = time.Duration(m.newest()+reach-now) * time.Microsecond
	r.QuotaAfter = m.quotaAfter(now, r.Window)
	if !sure && exactRetry != retry {
		other := r
		other.RetryAfter = time.Duration(exactRetry) * time.Microsecond
		alt = &other
	}
	return r, alt, remaining, true
}

// decide is AllowPolicy (write) or Peek (read-only) in the model, limits ascending.
func (m *modelLog) decide(now int64, n int, limits []engine.Limit, write bool) (r engine.Result, alt *engine.Result) {
	longest := micros(limits[len(limits)-1].Window)
	if write {
		m.horizon = max(m.horizon, longest)
		m.trim(now - m.horizon)
	}
	reach := max(longest, m.horizon)
	r, alt, remaining, denied := m.judge(now, n, limits, reach)
	if denied {
		return r, alt
	}
	r.Allowed = true
	if !write {
		r.Remaining = remaining
		if m.count(now, longest) > 0 {
			r.ResetAfter = time.Duration(m.newest()+reach-now) * time.Microsecond
		}
		r.QuotaAfter = m.quotaAfter(now, r.Window)
		return r, nil
	}
	r.Remaining = remaining - n
	seq := m.insert(now, n)
	r.ResetAfter = time.Duration(m.newest()+reach-now) * time.Microsecond
	r.QuotaAfter = m.quotaAfter(now, r.Window)
	r.Entry = engine.EntryID{Key: m.key, At: r.At, Seq: seq, Cost: n}
	return r, nil
}

// insert adds an entry of cost n at t after every entry at or before t (a caller behind
// inserts before later ones), and returns its seq; a refunded run at the end leaves once a
// later microsecond is appended.
func (m *modelLog) insert(t int64, n int) int {
	p, seq := len(m.entries), 1
	for i, e := range m.entries {
		if e.at > t {
			p = i
			break
		}
		if e.at == t {
			seq += e.span
		}
	}
	if p == len(m.entries) && p > 0 && m.entries[p-1].cost == 0 && m.entries[p-1].at < t {
		m.entries = m.entries[:p-1]
		p--
	}
	m.entries = slices.Insert(m.entries, p, modelEntry{at: t, seq: seq, span: 1, cost: n, was: n})
	m.weigh(t, n)
	return seq
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
			m.weigh(e.at, actual)
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

// coverWalk is how many entries a decision reads from each end of a window to find when a
// denied request would be admitted (lib_log.lua's COVER_WALK: TestCoverWalkIsTheScripts).
const coverWalk = 32

func micros(d time.Duration) int64 { return int64(d / time.Microsecond) }

// steppedClock is a caller's clock the test sets before each call.
type steppedClock struct{ now time.Time }

func (c *steppedClock) Now() time.Time { return c.now }

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

// child is this test binary run again as an OS process of its own (valkeytest.Rerun), for one
// test alone, on the example server; the test tells it what to do through its environment.
// It is stopped when the test ends, if it has not exited.
type child struct {
	*valkeytest.Process
	Stdout io.Reader // what it prints; read it to its end before Wait
}

// startChild starts the test named test as a child process, with env (NAME=value) added.
func startChild(t *testing.T, test string, env ...string) *child {
	t.Helper()
	p, stdout := valkeytest.Rerun(t, test, append(env, valkeytest.EnvAddr+"="+exampleServer.Addr)...)
	return &child{Process: p, Stdout: stdout}
}

// childDecisions runs processes children of test (startChild, child i with the environment
// env(i)) at once, parses each line of their output with parse (false: not a decision), and
// returns every child's decisions once all have exited; a child that failed fails t.
func childDecisions[D any](t *testing.T, processes int, test string, env func(i int) string, parse func(line string) (D, bool)) []D {
	t.Helper()
	var (
		mu  sync.Mutex
		all []D
		wg  sync.WaitGroup
	)
	for p := range processes {
		child := startChild(t, test, env(p))
		wg.Go(func() {
			sc := bufio.NewScanner(child.Stdout)
			var mine []D
			for sc.Scan() {
				if d, ok := parse(sc.Text()); ok {
					mine = append(mine, d)
				}
			}
			if err := child.Wait(); err != nil {
				t.Errorf("child %d: %v", p, err)
			}
			mu.Lock()
			all = append(all, mine...)
			mu.Unlock()
		})
	}
	wg.Wait()
	return all
}

// Wait waits for the child to exit, once its Stdout is read to the end, and returns how it
// ended (what it wrote to stderr is in the test's output).
func (c *child) Wait() error {
	<-c.Done()
	return c.Err()
}
