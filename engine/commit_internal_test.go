package engine

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/valkey-io/valkey-go"

	"github.com/strictrate/strictrate/internal/valkeytest"
)

// outcome is what a decision came back with, for these tests: its decision, the call's or its
// own error, a reply the scripts do not give, and what the acknowledgements answered.
type outcome struct {
	d             decision
	err, replyErr error
	ack           ackReplies
}

// admits reports whether o holds a decision that admitted.
func (o outcome) admits() bool { return o.err == nil && o.replyErr == nil && o.d.retryAfter == 0 }

// outcomeOf reads cl's outcome.
func outcomeOf(cl *call[request]) outcome {
	return outcome{d: cl.req.d, err: cl.err, replyErr: cl.req.replyErr, ack: cl.ack}
}

// doReq takes req through c, as decide does, and returns its outcome.
func doReq(c *commit[request], ctx context.Context, req request) outcome {
	cl := c.do(ctx, req, c.route(req.key, req.now != ""))
	out := outcomeOf(cl)
	c.release(cl)
	return out
}

// newBatch is a batch from c's pool.
func newBatch(c *commit[request]) *batch[request] { return c.batches.Get().(*batch[request]) }

// waitQueued waits until q holds n waiting calls.
func waitQueued(t *testing.T, c *commit[request], q *queue[request], n int) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
		c.mu.Lock()
		got := len(q.waiting)
		c.mu.Unlock()
		if got == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d calls waiting, want %d", got, n)
		}
	}
}

// A panic while a committer goroutine sends a batch reaches every caller of the batch as its
// error; the batch is counted out, and the committer sends the next batch, and takes the
// next decision, as before. Calls go back to the pool through all of it and are reused
// without carrying anything over.
func TestBatchPanicReachesEveryCaller(t *testing.T) {
	client := valkeytest.New(t).Client(t)
	e, err := New(client, WithBatching(true))
	if err != nil {
		t.Fatal(err)
	}
	c, ctx := e.decides, context.Background()
	good := e.oneLimit(Limit{Max: 10, Window: time.Minute})
	req := func(set *limitSet) request {
		key := e.prefix + "batchpanic:" + uuid.NewString()
		if set == nil { // a request no caller can make: laying it out panics
			return request{key: key, n: 1, record: 1}
		}
		r, err := newRequest(key, clockReading{}, 1, true, set)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	// Hold the destination busy, as a call in flight does, so that the requests queue.
	c.mu.Lock()
	q := c.queue(destination{})
	q.inFlight++
	c.mu.Unlock()

	// The first batch panics (a request without limits); the second waits behind it.
	var wg sync.WaitGroup
	outs := make([]outcome, 5)
	for i := range 3 {
		wg.Go(func() { outs[i] = doReq(c, ctx, req(nil)) })
	}
	waitQueued(t, c, q, 3)
	for i := 3; i < 5; i++ {
		wg.Go(func() { outs[i] = doReq(c, ctx, req(good)) })
	}
	waitQueued(t, c, q, 5)
	// Taken as a committer would, the five would go in one batch: take the three by hand.
	b := newBatch(c)
	c.mu.Lock()
	q.inFlight--
	b.calls = append(b.calls[:0], q.waiting[:3]...)
	q.waiting = append(q.waiting[:0], q.waiting[3:]...)
	for _, cl := range b.calls {
		cl.sent = true
	}
	q.inFlight++
	c.mu.Unlock()
	c.sendTaken(q, b) // sends the panicking batch, then the waiting one, on this goroutine
	wg.Wait()
	for i, out := range outs {
		switch {
		case i < 3 && (out.err == nil || !strings.Contains(out.err.Error(), "panic")):
			t.Errorf("caller %d of the panicking batch: %v, want the panic", i, out.err)
		case i >= 3 && (out.err != nil || out.replyErr != nil || !out.admits()):
			t.Errorf("caller %d of the next batch: %+v, want an admission", i, out)
		}
	}
	c.mu.Lock()
	inFlight, waiting := q.inFlight, len(q.waiting)
	c.mu.Unlock()
	if inFlight != 0 || waiting != 0 {
		t.Fatalf("after both batches: %d in flight, %d waiting; want none", inFlight, waiting)
	}
	for range 3 {
		if out := doReq(c, ctx, req(good)); out.err != nil || !out.admits() || out.d.remaining != 9 {
			t.Fatalf("a decision after the panic: %+v, want an admission with 9 remaining", out)
		}
	}
}

// A caller whose context ends after its request was taken into a batch leaves its call to the
// batch, which still signals it; the call is not reused while the batch may write to it.
func TestBatchStillSignalsACallerGoneAfterSend(t *testing.T) {
	client := valkeytest.New(t).Client(t)
	e, err := New(client, WithBatching(true))
	if err != nil {
		t.Fatal(err)
	}
	c := e.decides
	set := e.oneLimit(Limit{Max: 10, Window: time.Minute})
	c.mu.Lock()
	q := c.queue(destination{})
	q.inFlight++
	c.mu.Unlock()
	ctx, cancel := context.WithCancel(context.Background())
	r, _ := newRequest(e.prefix+"gone:"+uuid.NewString(), clockReading{}, 1, true, set)
	done := make(chan outcome)
	go func() { done <- doReq(c, ctx, r) }()
	waitQueued(t, c, q, 1)
	b := newBatch(c)
	c.mu.Lock()
	q.inFlight--
	c.take(q, b)
	c.mu.Unlock()
	cancel()
	if out := <-done; out.err != context.Canceled {
		t.Fatalf("the cancelled caller got %+v, want context.Canceled", out)
	}
	cl := b.calls[0]
	c.sendTaken(q, b)
	select {
	case <-cl.done:
	default:
		t.Fatal("the batch did not signal the call of the caller that left")
	}
	if out := outcomeOf(cl); !out.admits() {
		t.Fatalf("the left call's outcome: %+v, want an admission", out)
	}
}

// BenchmarkCommitterBatched takes decisions on many keys through one committer from 64
// goroutines: the committer's own allocations per decision (no key prefixing, no Result).
func BenchmarkCommitterBatched(b *testing.B) {
	client := valkeytest.New(b).Client(b)
	e, err := New(client, WithBatching(true))
	if err != nil {
		b.Fatal(err)
	}
	set := e.oneLimit(Limit{Max: 1 << 20, Window: time.Second})
	keys := make([]request, 1024)
	for i := range keys {
		if keys[i], err = newRequest(e.prefix+"bench:"+uuid.NewString(), clockReading{}, 1, true, set); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportAllocs()
	b.SetParallelism(32)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		ctx, i := context.Background(), 0
		for pb.Next() {
			if out := doReq(e.decides, ctx, keys[i%len(keys)]); out.err != nil || out.replyErr != nil {
				b.Error(out.err, out.replyErr)
				return
			}
			i += 7
		}
	})
}

// sendByHand sends reqs as one batch taken from q, on this goroutine, as a committer's
// goroutine would, and returns their outcomes in order.
func sendByHand(t *testing.T, c *commit[request], q *queue[request], ctx context.Context, reqs []request) []outcome {
	t.Helper()
	b := newBatch(c)
	for _, r := range reqs {
		cl := c.calls.Get().(*call[request])
		cl.ctx, cl.req, cl.dest = ctx, r, destination{node: q.node}
		b.calls = append(b.calls, cl)
	}
	c.sendBatch(q, b)
	outs := make([]outcome, len(b.calls))
	for i, cl := range b.calls {
		<-cl.done
		outs[i] = outcomeOf(cl)
		c.release(cl)
	}
	b.calls = b.calls[:0]
	c.batches.Put(b)
	return outs
}

// mustRequest is a request for one event of full (a key with the engine's prefix) on the
// server's clock.
func mustRequest(t *testing.T, full string, set *limitSet) request {
	t.Helper()
	r, err := newRequest(full, clockReading{}, 1, true, set)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// wantEntries fails t unless key's log (key without the engine's prefix) holds n entries.
func wantEntries(t *testing.T, e *Engine, key string, n int) {
	t.Helper()
	if log := readLog(t, e, key); log.Count != n {
		t.Fatalf("%s holds %d entries, want %d", key, log.Count, n)
	}
}

// serverReply is the error reply a server gives to a script that returns it: a real
// *valkey.ValkeyError of that text.
func serverReply(t *testing.T, c valkey.Client, text string) error {
	t.Helper()
	err := c.Do(context.Background(), c.B().Eval().Script("return redis.error_reply(ARGV[1])").Numkeys(0).Arg(text).Build()).Error()
	if _, ok := valkey.IsValkeyErr(err); !ok {
		t.Fatalf("error reply %q came back as %v", text, err)
	}
	return err
}

// The errors a batch call may end with, sorted into those that say it never ran (each of its
// decisions is sent again alone) and the others (each caller's, as they are): only a refusal
// before the script ran, or a connection that was never opened, is sent again. Inside a batch's
// reply, only a request the node could not serve is.
func TestBatchRetriesOnlyWhatNeverRan(t *testing.T) {
	c := valkeytest.New(t).Client(t)
	for text, want := range map[string]bool{
		"MOVED 3999 127.0.0.1:6381":                               true,
		"ASK 3999 127.0.0.1:6381":                                 true,
		"TRYAGAIN Multiple keys request during rehashing of slot": true,
		"CROSSSLOT Keys in request don't hash to the same slot":   true,
		"CLUSTERDOWN The cluster is down":                         true,
		"READONLY You can't write against a read only replica.":   true,
		"OOM command not allowed when used memory > 'maxmemory'.": true,
		"BUSY Valkey is busy running a script.":                   false,
		"LOADING Valkey is loading the dataset in memory":         false,
		"NOSCRIPT No matching script.":                            false,
		"ERR Error running script":                                false,
		"MOVEDX not a redirection":                                false,
		"BADLAYOUT the key holds a string, not a strictrate log":  false,
	} {
		if got := refusedBeforeRun(serverReply(t, c, text)); got != want {
			t.Errorf("refusedBeforeRun(%q) = %v, want %v", text, got, want)
		}
	}
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{&net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}, true},
		{fmt.Errorf("wrapped: %w", &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}), true},
		{&net.OpError{Op: "read", Net: "tcp", Err: syscall.ECONNRESET}, false},
		{&net.OpError{Op: "write", Net: "tcp", Err: syscall.EPIPE}, false},
		{io.EOF, false},
		{context.DeadlineExceeded, false},
		{valkey.ErrClosing, false},
	} {
		if got := refusedBeforeRun(tc.err); got != tc.want {
			t.Errorf("refusedBeforeRun(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
	for text, want := range map[string]bool{
		"ERR Script attempted to access a non local key in a cluster node script: 1f0e, on @user_script:12.": true,
		"ERR Script attempted to execute a command while the cluster is down":                                true,
		"BADLAYOUT the key holds a string, not a strictrate log":                                             false,
		"MOVED 3999 127.0.0.1:6381": false,
	} {
		if got := notTakenOnNode(serverReply(t, c, text)); got != want {
			t.Errorf("notTakenOnNode(%q) = %v, want %v", text, got, want)
		}
	}
	if notTakenOnNode(errors.New("Script attempted to access a non local key in a cluster node")) {
		t.Error("notTakenOnNode(a client-side error of the same text) = true, want false: only a server's reply says so")
	}
}

// A batch for one node spans several of its slots, one of them migrating: the node takes the
// decisions whose keys it holds, in one call, and each decision whose key it does not hold
// (moved to the target, or not yet made: both asked elsewhere with ASK) fails inside the reply
// and goes again alone, through the cluster client, which follows ASK. Every decision is
// taken once: each log holds one entry per admission.
func TestBatchOnNodeSplitsWhatTheNodeDoesNotHold(t *testing.T) {
	valkeytest.SkipIfShort(t, "starts a cluster")
	cl := valkeytest.NewCluster(t, 3, 0)
	e := clusterEngine(t, cl)
	ctx := context.Background()
	c, from, to := e.decides, cl.Primaries[0], cl.Primaries[1]
	slot := from.First + 11
	set := e.oneLimit(Limit{Max: 10, Window: time.Hour})
	moved := strings.TrimPrefix(valkeytest.KeyInSlot(e.prefix+"split:moved:"+uuid.NewString()+":", slot), e.prefix)
	kept := strings.TrimPrefix(valkeytest.KeyInSlot(e.prefix+"split:kept:"+uuid.NewString()+":", slot), e.prefix)
	fresh := strings.TrimPrefix(valkeytest.KeyInSlot(e.prefix+"split:fresh:"+uuid.NewString()+":", slot), e.prefix)
	others := keysOn(t, e, from, 3, slot)
	// moved and kept have a log before the migration starts.
	for _, k := range []string{moved, kept} {
		if r, err := e.Allow(ctx, k, Limit{Max: 10, Window: time.Hour}); err != nil || !r.Allowed {
			t.Fatalf("first Allow of %s: %+v, %v; want an admission", k, r, err)
		}
	}
	m, err := cl.BeginMigration(ctx, slot, from, to)
	if err != nil {
		t.Fatal(err)
	}
	if err := m.MoveKey(ctx, e.prefix+moved); err != nil {
		t.Fatal(err)
	}
	keys := append([]string{moved, kept, fresh}, others...)
	reqs := make([]request, len(keys))
	for i, k := range keys {
		reqs[i] = mustRequest(t, e.prefix+k, set)
	}
	fromCalls, fromRejected := scriptCallsOn(t, from)
	outs := sendByHand(t, c, &queue[request]{node: from.Addr}, ctx, reqs)
	for i, out := range outs {
		if out.err != nil || out.replyErr != nil || !out.admits() {
			t.Fatalf("decision %d (%s): %v, %v, %+v; want an admission", i, keys[i], out.err, out.replyErr, out.d)
		}
	}
	if got := c.retried.Load(); got != 2 {
		t.Fatalf("%d decisions sent again alone, want 2 (the key moved and the key not made yet)", got)
	}
	// The source ran the batch, and refused each retry's first try with ASK.
	if calls, rejected := scriptCallsOn(t, from); calls-fromCalls != 1 || rejected-fromRejected != 2 {
		t.Fatalf("the source ran %d script calls and refused %d; want the batch, and the two retries it sent on with ASK",
			calls-fromCalls, rejected-fromRejected)
	}
	if asked := commandStatsOn(t, to)["asking"].Calls; asked < 2 {
		t.Fatalf("the target served %d ASKING, want the two retries", asked)
	}
	if err := m.Finish(ctx); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{moved, kept} {
		wantEntries(t, e, k, 2)
	}
	for _, k := range append([]string{fresh}, others...) {
		wantEntries(t, e, k, 1)
	}

	// The slot is the target's now. A batch still bound for the source by the engine's map
	// finds none of the slot's keys there: they go again alone (MOVED, followed by the cluster
	// client), and the map loads again and names the target.
	loads := c.slots.loads.Load()
	reqs = []request{mustRequest(t, e.prefix+moved, set), mustRequest(t, e.prefix+kept, set)}
	for i, out := range sendByHand(t, c, &queue[request]{node: from.Addr}, ctx, reqs) {
		if out.err != nil || !out.admits() {
			t.Fatalf("decision %d after the move, sent to the source: %v, %+v; want an admission", i, out.err, out.d)
		}
	}
	if got := c.retried.Load(); got != 4 {
		t.Fatalf("%d decisions sent again alone in all, want 4", got)
	}
	if err := valkeytest.WaitFor(ctx, 5*time.Second, "the slot map to load again and name the target", func() (bool, error) {
		addr, ok := c.slots.primary(uint16(slot))
		return ok && addr == to.Addr && c.slots.loads.Load() > loads, nil
	}); err != nil {
		t.Fatal(err)
	}
	wantEntries(t, e, moved, 3)
	wantEntries(t, e, kept, 3)
	// A burst of reloads makes one load, or two: the one it starts, and one for the reloads
	// asked for while that one ran, slotMapReloadEvery after it.
	if err := valkeytest.WaitFor(ctx, 5*time.Second, "the loads to settle", func() (bool, error) {
		return !c.slots.loading.Load(), nil
	}); err != nil {
		t.Fatal(err)
	}
	loads = c.slots.loads.Load()
	began := time.Now()
	for range 100 {
		c.slots.reload()
	}
	if err := valkeytest.WaitFor(ctx, 5*time.Second, "the reloads to land", func() (bool, error) {
		return !c.slots.loading.Load() && !c.slots.dirty.Load(), nil
	}); err != nil {
		t.Fatal(err)
	}
	got := c.slots.loads.Load() - loads
	if got < 1 || got > 2 {
		t.Fatalf("100 reloads in a row made %d loads, want 1 or 2", got)
	}
	if got == 2 && time.Since(began) < slotMapReloadEvery {
		t.Fatalf("two loads within %s, less than %s apart", time.Since(began), slotMapReloadEvery)
	}
}

// A batch for a node the engine's client does not know, or whose connection cannot be opened
// (its process is gone), never left: each of its decisions goes again alone, through the
// cluster client, and is taken once.
func TestBatchForAGoneNodeGoesAgainAlone(t *testing.T) {
	valkeytest.SkipIfShort(t, "starts a cluster")
	cl := valkeytest.NewCluster(t, 3, 0)
	e := clusterEngine(t, cl)
	ctx := context.Background()
	c := e.decides
	set := e.oneLimit(Limit{Max: 10, Window: time.Hour})
	// A client of an address whose server is gone: every connection it opens is refused. (A
	// connection that was open when its server died answers the first call after with EOF,
	// which the engine cannot tell from a call cut short once written: that one is the
	// callers' error.)
	dead := valkeytest.New(t, valkeytest.OwnServer())
	deadAddr := dead.Addr
	if err := dead.Close(); err != nil {
		t.Fatal(err)
	}
	gone, err := valkey.NewClient(valkey.ClientOption{InitAddress: []string{deadAddr}, ForceSingleClient: true, DisableRetry: true})
	if gone == nil {
		t.Fatalf("a client of a gone server: %v", err)
	}
	defer gone.Close()
	// The dead node's client is one the slot map holds, under an address of its own.
	nc := c.slots.nodesSince(time.Now())
	clients := maps.Clone(nc.clients)
	clients[deadAddr] = gone
	c.slots.nodes.Store(&nodeClients{at: time.Now().Add(time.Hour), clients: clients})

	for _, addr := range []string{deadAddr, "127.0.0.1:1"} {
		before := c.retried.Load()
		keys := keysOn(t, e, cl.Primaries[0], 3, -1)
		reqs := make([]request, len(keys))
		for i, k := range keys {
			reqs[i] = mustRequest(t, e.prefix+k, set)
		}
		for i, out := range sendByHand(t, c, &queue[request]{node: addr}, ctx, reqs) {
			if out.err != nil || out.replyErr != nil || !out.admits() {
				t.Fatalf("batch for %s: decision %d: %v, %v, %+v; want an admission", addr, i, out.err, out.replyErr, out.d)
			}
		}
		if got := c.retried.Load() - before; got != int64(len(keys)) {
			t.Fatalf("batch for %s: %d decisions sent again alone, want %d", addr, got, len(keys))
		}
		for _, k := range keys {
			wantEntries(t, e, k, 1)
		}
	}
}

// A batch call that may have run is never sent again: one that times out on a node that is
// paused (it was written; whether the node runs it is the node's affair) is each caller's
// error, no decision of it goes again, and no key holds more than one entry for it.
func TestBatchThatMayHaveRunIsNotSentAgain(t *testing.T) {
	valkeytest.SkipIfShort(t, "starts a cluster")
	cl := valkeytest.NewCluster(t, 3, 0)
	e := clusterEngine(t, cl)
	c, node := e.decides, cl.Primaries[2]
	set := e.oneLimit(Limit{Max: 10, Window: time.Hour})
	keys := keysOn(t, e, node, 3, -1)
	reqs := make([]request, len(keys))
	for i, k := range keys {
		reqs[i] = mustRequest(t, e.prefix+k, set)
	}
	// Warm the node's connection, so the call below is written at once.
	for i, out := range sendByHand(t, c, &queue[request]{node: node.Addr}, context.Background(), reqs[:2]) {
		if !out.admits() {
			t.Fatalf("warm-up decision %d: %v, %+v; want an admission", i, out.err, out.d)
		}
	}
	nc := node.Client()
	const pause = 1500 * time.Millisecond
	if err := nc.Do(context.Background(), nc.B().ClientPause().Timeout(pause.Milliseconds()).All().Build()).Error(); err != nil {
		t.Fatal(err)
	}
	paused := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	before := c.retried.Load()
	for i, out := range sendByHand(t, c, &queue[request]{node: node.Addr}, ctx, reqs) {
		if !errors.Is(out.err, context.DeadlineExceeded) {
			t.Fatalf("decision %d on a paused node: %v, %+v; want the deadline's error", i, out.err, out.d)
		}
	}
	if got := c.retried.Load() - before; got != 0 {
		t.Fatalf("%d decisions of a call that may have run were sent again, want 0", got)
	}
	time.Sleep(time.Until(paused.Add(pause + 200*time.Millisecond)))
	for i, k := range keys {
		log := readLog(t, e, k)
		warm := 0
		if i < 2 {
			warm = 1
		}
		if log.Count < warm || log.Count > warm+1 {
			t.Fatalf("%s holds %d entries after %d warm-up decisions and one call that timed out, want %d or %d", k, log.Count, warm, warm, warm+1)
		}
	}
}

// On a standalone server over maxmemory, the batch script (whose flags lack allow-oom) is
// refused before it runs: each decision goes again alone, and decide.lua still decides a key
// whose log needs no more memory, as it does unbatched.
func TestBatchOverMaxmemoryGoesAgainAlone(t *testing.T) {
	own := valkeytest.New(t, valkeytest.OwnServer())
	client := own.Client(t)
	e, err := New(client, WithBatching(true))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	l := Limit{Max: 5, Window: time.Minute}
	keys := []string{"oom:" + uuid.NewString(), "oom:" + uuid.NewString(), "oom:" + uuid.NewString()}
	for _, k := range keys {
		if r, err := e.Allow(ctx, k, l); err != nil || !r.Allowed {
			t.Fatalf("Allow %s: %+v, %v; want an admission", k, r, err)
		}
	}
	for _, kv := range [][2]string{{"maxmemory-policy", "noeviction"}, {"maxmemory", "1"}} {
		if err := client.Do(ctx, client.B().ConfigSet().ParameterValue().ParameterValue(kv[0], kv[1]).Build()).Error(); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		_ = client.Do(context.Background(), client.B().ConfigSet().ParameterValue().ParameterValue("maxmemory", "0").Build()).Error()
	})
	c, set := e.decides, e.oneLimit(l)
	reqs := make([]request, len(keys))
	for i, k := range keys {
		reqs[i] = mustRequest(t, e.prefix+k, set)
	}
	for i, out := range sendByHand(t, c, &queue[request]{}, ctx, reqs) {
		if out.err != nil || !out.admits() || out.d.remaining != 3 {
			t.Fatalf("decision %d over maxmemory: %+v, want an admission with 3 remaining", i, out)
		}
	}
	if got := c.retried.Load(); got != int64(len(keys)) {
		t.Fatalf("%d decisions sent again alone, want %d", got, len(keys))
	}
}

// A batch sent to a node carries its acknowledgement as a call through the cluster client
// does: WithReplicaAck's WAIT goes behind it on the node's connection, once per call, and
// every decision of the batch is held by the replica when its caller hears yes.
func TestBatchOnNodeWaitsForReplicas(t *testing.T) {
	valkeytest.SkipIfShort(t, "starts a cluster")
	cl := valkeytest.NewCluster(t, 3, 1)
	e := clusterEngine(t, cl, WithReplicaAck(1, 2*time.Second))
	ctx := context.Background()
	primary, replica := cl.Primaries[0], cl.Replicas[0]
	set := e.oneLimit(Limit{Max: 10, Window: time.Hour})
	keys := keysOn(t, e, primary, 4, -1)
	reqs := make([]request, len(keys))
	for i, k := range keys {
		reqs[i] = mustRequest(t, e.prefix+k, set)
	}
	pc := primary.Client()
	if err := pc.Do(ctx, pc.B().ConfigResetstat().Build()).Error(); err != nil {
		t.Fatal(err)
	}
	for i, out := range sendByHand(t, e.decides, &queue[request]{node: primary.Addr}, ctx, reqs) {
		if out.err != nil || !out.admits() || out.ack.err != nil || out.ack.replicas != 1 {
			t.Fatalf("decision %d: %v, %+v, ack %+v; want an admission one replica acknowledged", i, out.err, out.d, out.ack)
		}
	}
	stats := commandStatsOn(t, primary)
	if stats["evalsha"].Calls+stats["eval"].Calls != 1 || stats["wait"].Calls != 1 {
		t.Fatalf("the primary ran %d script calls and %d WAIT; want one of each for the batch",
			stats["evalsha"].Calls+stats["eval"].Calls, stats["wait"].Calls)
	}
	rc := replica.Client()
	for _, k := range keys {
		rs := rc.DoMulti(ctx, rc.B().Readonly().Build(), rc.B().Exists().Key(e.prefix+k).Build())
		if n, err := rs[1].AsInt64(); err != nil || n != 1 {
			t.Fatalf("the replica holds %s: %d, %v; want it, acknowledged", k, n, err)
		}
	}
}
