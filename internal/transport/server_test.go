package transport

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/valkey-io/valkey-go"

	"github.com/strictrate/strictrate/internal/valkeytest"
	"github.com/strictrate/strictrate/loader"
)

// The transport against real servers, with a kind of its own: a request is keys to count,
// each counted once (INCR) when the node serves all of them, none otherwise, as decide_all.lua
// peeks every key before it records any. A key's count is how many times a request on it was
// taken: exactly once per request, whatever was retried.

// countBody is the counting script after its flags: keys declared, or undeclared (numkeys 0,
// then their number and the keys in ARGV, as lib_keys.lua reads them), then per request its
// number of keys. The reply is the server's now, then per key its count, 0 when another key of
// its request failed, or the error of the command the node refused on it.
const countBody = `
local keys, a = KEYS, 1
if #KEYS == 0 then
  keys = {}
  local n = tonumber(ARGV[1])
  for i = 1, n do keys[i] = ARGV[1 + i] end
  a = n + 2
end
local function failure(e)
  if type(e) == 'table' and e.err ~= nil then e = e.err end
  return {err = tostring(e)}
end
local reply, at = {tonumber(redis.call('TIME')[1])}, 1
while ARGV[a] ~= nil do
  local last, failed = at + tonumber(ARGV[a]) - 1, false
  a = a + 1
  for i = at, last do
    local ok, e = pcall(redis.call, 'EXISTS', keys[i])
    if not ok then reply[1 + i], failed = failure(e), true end
  end
  for i = at, last do
    if failed then
      if reply[1 + i] == nil then reply[1 + i] = 0 end
    else
      local ok, v = pcall(redis.call, 'INCR', keys[i])
      if ok then reply[1 + i] = v else reply[1 + i] = failure(v) end
    end
  end
  at = last + 1
end
return reply`

// counting is the counting kind: lone requests as a script that runs over maxmemory
// (allow-oom), batches as one that does not and reaches keys of several slots. shared makes
// both one script, as AllowAll's groups have.
func counting(shared bool) Kind[[]string, []int64] {
	single := loader.New("count", "#!lua flags=allow-oom\n"+countBody)
	batch := loader.New("count_batch", "#!lua flags=allow-cross-slot-keys\n"+countBody)
	if shared {
		single = batch
	}
	return Kind[[]string, []int64]{Single: single, Batch: batch, Acked: true, Routed: true,
		Encode: func(reqs [][]string, keys, args []string) ([]string, []string) {
			for _, r := range reqs {
				keys = append(keys, r...)
				args = append(args, strconv.Itoa(len(r)))
			}
			return keys, args
		},
		Decode: decodeCounts,
		Size:   func(r *[]string) (int, int) { return len(*r), 0 },
	}
}

// decodeCounts reads the counting script's reply: per request, its keys' counts, and its
// first key's error.
func decodeCounts(reply valkey.ValkeyResult, reqs [][]string, outs []Outcome[[]int64]) {
	if reply.Error() != nil {
		return
	}
	vals, err := reply.ToArray()
	if err == nil && len(vals) != 1+len(slices.Concat(reqs...)) {
		err = fmt.Errorf("%d values", len(vals))
	}
	if err != nil {
		for i := range outs {
			outs[i].Invalid = err
		}
		return
	}
	at := 1
	for i, r := range reqs {
		o := &outs[i]
		for _, v := range vals[at : at+len(r)] {
			if err := v.Error(); err != nil {
				if o.Err == nil {
					o.Err = err
				}
				o.Reply = append(o.Reply, -1)
				continue
			}
			n, _ := v.AsInt64()
			o.Reply = append(o.Reply, n)
			o.Recorded = o.Recorded || n > 0
		}
		at += len(r)
	}
}

// counts reads each key's count through client.
func counts(t *testing.T, client valkey.Client, keys ...string) []int64 {
	t.Helper()
	out := make([]int64, len(keys))
	for i, k := range keys {
		n, err := client.Do(context.Background(), client.B().Get().Key(k).Build()).AsInt64()
		if err != nil && !valkey.IsValkeyNil(err) {
			t.Fatalf("GET %s: %v", k, err)
		}
		out[i] = n
	}
	return out
}

// wantCounts fails t unless every key's count is want.
func wantCounts(t *testing.T, client valkey.Client, want int64, keys ...string) {
	t.Helper()
	for i, n := range counts(t, client, keys...) {
		if n != want {
			t.Fatalf("key %s counted %d times, want %d", keys[i], n, want)
		}
	}
}

// sendBatch sends reqs as one batch to node (its address; "" for the engine's client), on
// this goroutine, as a committer would, and returns their outcomes.
func sendBatch[Req, Rep any](c *Commit[Req, Rep], ctx context.Context, node string, reqs ...Req) []Outcome[Rep] {
	b := c.batches.Get().(*batch[Req, Rep])
	for _, r := range reqs {
		b.calls = append(b.calls, c.get(ctx, r, Dest{node: node}))
	}
	c.sendBatch(b)
	outs := make([]Outcome[Rep], len(b.calls))
	for i, cl := range b.calls {
		<-cl.done
		outs[i] = c.outcome(ctx, cl)
		c.put(cl)
	}
	clear(b.calls)
	b.calls = b.calls[:0]
	c.batches.Put(b)
	return outs
}

// each is each key as a request of its own.
func each(keys ...string) [][]string {
	reqs := make([][]string, len(keys))
	for i, k := range keys {
		reqs[i] = []string{k}
	}
	return reqs
}

// clusterTransport is a transport on a cluster client of c, batching on, its slot map loaded
// and the counting scripts on every node.
func clusterTransport(t *testing.T, c *valkeytest.Cluster, ack Ack) *Transport {
	t.Helper()
	tr := New(c.Client(t, valkey.ClientOption{}), true, ack)
	k := counting(false)
	if err := loader.Preload(context.Background(), tr.client, k.Single, k.Batch); err != nil {
		t.Fatal(err)
	}
	if err := valkeytest.WaitFor(context.Background(), 10*time.Second, "the slot map to load", func() (bool, error) {
		_, ok := tr.slots.primary(0)
		return ok, nil
	}); err != nil {
		t.Fatal(err)
	}
	return tr
}

// keysOn returns n fresh keys that node serves, each in a slot of its own, none in skip.
func keysOn(node *valkeytest.Node, n, skip int) []string {
	var keys []string
	slots := map[int]bool{skip: true}
	for len(keys) < n {
		k := "count:" + uuid.NewString()
		if slot := valkeytest.KeySlot(k); node.Owns(k) && !slots[slot] {
			slots[slot] = true
			keys = append(keys, k)
		}
	}
	return keys
}

// commandStats reads node's INFO commandstats.
func commandStats(t *testing.T, node *valkeytest.Node) map[string]valkeytest.CommandStat {
	t.Helper()
	info, err := valkeytest.ReadInfo(context.Background(), node.Client(), "commandstats")
	if err != nil {
		t.Fatal(err)
	}
	return info.CommandStats()
}

// scriptCalls reads how many script calls (EVALSHA, EVAL) node ran, and how many it refused
// before running them (a redirection).
func scriptCalls(t *testing.T, node *valkeytest.Node) (calls, rejected int64) {
	t.Helper()
	stats := commandStats(t, node)
	for _, name := range []string{"evalsha", "eval"} {
		calls += stats[name].Calls
		rejected += stats[name].RejectedCalls
	}
	return calls, rejected
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

// The errors a call may end with, sorted into those that say it never ran (its requests go
// again alone) and the others (each caller's, as they are): only a refusal before the script
// ran, or a connection that was never opened, goes again; OOM only when the request alone is
// another script. Inside a reply, only a request the node could not serve, and that recorded
// nothing, does.
func TestRetryRuleSendsAgainOnlyWhatNeverRan(t *testing.T) {
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
	nonLocal := serverReply(t, c, "ERR Script attempted to access a non local key in a cluster node script: 1f0e, on @user_script:12.")
	for text, want := range map[string]bool{
		"ERR Script attempted to execute a command while the cluster is down": true,
		"BADLAYOUT the key holds a string, not a strictrate log":              false,
		"MOVED 3999 127.0.0.1:6381":                                           false,
	} {
		if got := notTakenOnNode(serverReply(t, c, text)); got != want {
			t.Errorf("notTakenOnNode(%q) = %v, want %v", text, got, want)
		}
	}
	if !notTakenOnNode(nonLocal) {
		t.Error("notTakenOnNode(a non local key) = false, want true")
	}
	if notTakenOnNode(errors.New("Script attempted to access a non local key in a cluster node")) {
		t.Error("notTakenOnNode(a client-side error of the same text) = true, want false: only a server's reply says so")
	}
	oom := serverReply(t, c, "OOM command not allowed when used memory > 'maxmemory'.")
	apart, shared := &Commit[int, int]{kind: Kind[int, int]{Single: loader.New("a", "return 1"), Batch: loader.New("b", "return 2")}}, &Commit[int, int]{}
	shared.kind.Single, shared.kind.Batch = apart.kind.Batch, apart.kind.Batch
	for _, tc := range []struct {
		c     *Commit[int, int]
		batch bool
		want  bool
	}{{apart, true, true}, {apart, false, false}, {shared, true, false}} {
		if got := tc.c.notTaken(oom, &Outcome[int]{}, tc.batch); got != tc.want {
			t.Errorf("notTaken(OOM), batch %v, one script %v: %v, want %v", tc.batch, tc.c == shared, got, tc.want)
		}
	}
	if (&Commit[int, int]{}).notTaken(nil, &Outcome[int]{Err: nonLocal, Recorded: true}, true) {
		t.Error("notTaken of a request that recorded something: true, want false")
	}
}

// On a standalone server over maxmemory, the batch script (whose flags lack allow-oom) is
// refused before it runs: each request goes again alone, where the single script (allow-oom)
// takes it.
func TestBatchOverMaxmemoryGoesAgainAlone(t *testing.T) {
	own := valkeytest.New(t, valkeytest.OwnServer())
	client := own.Client(t)
	c := NewCommit(New(client, true, Ack{}), counting(false))
	ctx := context.Background()
	keys := []string{"oom:" + uuid.NewString(), "oom:" + uuid.NewString(), "oom:" + uuid.NewString()}
	for _, o := range sendBatch(c, ctx, "", each(keys...)...) {
		if o.Err != nil || !o.Recorded {
			t.Fatalf("before maxmemory: %+v, want a count", o)
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
	for i, o := range sendBatch(c, ctx, "", each(keys...)...) {
		if o.Err != nil || len(o.Reply) != 1 || o.Reply[0] != 2 {
			t.Fatalf("request %d over maxmemory: %+v, want its second count", i, o)
		}
	}
	if got := c.Retried(); got != int64(len(keys)) {
		t.Fatalf("%d requests sent again alone, want %d", got, len(keys))
	}
	// A kind whose one script is its batch script sends nothing again: alone it is refused
	// alike.
	shared := NewCommit(New(client, true, Ack{}), counting(true))
	for i, o := range sendBatch(shared, ctx, "", each(keys...)...) {
		if o.Err == nil || !strings.HasPrefix(o.Err.Error(), "OOM") {
			t.Fatalf("request %d of one script over maxmemory: %+v, want OOM", i, o)
		}
	}
	if got := shared.Retried(); got != 0 {
		t.Fatalf("%d requests of one script sent again, want 0", got)
	}
}

// A batch for one node spans several of its slots, one of them migrating: the node takes the
// requests whose keys it holds, in one call, and each request whose key it does not hold
// (moved to the target, or not yet made: both asked elsewhere with ASK) fails inside the reply
// and goes again alone, through the cluster client, which follows ASK. Every request is taken
// once. After the move, a batch still bound for the source goes again alone (MOVED), the map
// loads again and names the target, and a burst of reloads makes one load, or two.
func TestBatchOnNodeSplitsWhatTheNodeDoesNotHold(t *testing.T) {
	valkeytest.SkipIfShort(t, "starts a cluster")
	cl := valkeytest.NewCluster(t, 3, 0)
	tr := clusterTransport(t, cl, Ack{})
	c := NewCommit(tr, counting(false))
	ctx := context.Background()
	from, to := cl.Primaries[0], cl.Primaries[1]
	slot := from.First + 11
	moved := valkeytest.KeyInSlot("split:moved:"+uuid.NewString()+":", slot)
	kept := valkeytest.KeyInSlot("split:kept:"+uuid.NewString()+":", slot)
	fresh := valkeytest.KeyInSlot("split:fresh:"+uuid.NewString()+":", slot)
	others := keysOn(from, 3, slot)
	for _, k := range []string{moved, kept} {
		if err := tr.client.Do(ctx, tr.client.B().Incr().Key(k).Build()).Error(); err != nil {
			t.Fatal(err)
		}
	}
	m, err := cl.BeginMigration(ctx, slot, from, to)
	if err != nil {
		t.Fatal(err)
	}
	if err := m.MoveKey(ctx, moved); err != nil {
		t.Fatal(err)
	}
	keys := append([]string{moved, kept, fresh}, others...)
	fromCalls, fromRejected := scriptCalls(t, from)
	for i, o := range sendBatch(c, ctx, from.Addr, each(keys...)...) {
		if o.Err != nil || !o.Recorded {
			t.Fatalf("request %d (%s): %+v; want it counted", i, keys[i], o)
		}
	}
	if got := c.Retried(); got != 2 {
		t.Fatalf("%d requests sent again alone, want 2 (the key moved and the key not made yet)", got)
	}
	if calls, rejected := scriptCalls(t, from); calls-fromCalls != 1 || rejected-fromRejected != 2 {
		t.Fatalf("the source ran %d script calls and refused %d; want the batch, and the two retries it sent on with ASK",
			calls-fromCalls, rejected-fromRejected)
	}
	if asked := commandStats(t, to)["asking"].Calls; asked < 2 {
		t.Fatalf("the target served %d ASKING, want the two retries", asked)
	}
	if err := m.Finish(ctx); err != nil {
		t.Fatal(err)
	}
	wantCounts(t, tr.client, 2, moved, kept)
	wantCounts(t, tr.client, 1, append([]string{fresh}, others...)...)

	loads := tr.slots.loads.Load()
	for i, o := range sendBatch(c, ctx, from.Addr, each(moved, kept)...) {
		if o.Err != nil || !o.Recorded {
			t.Fatalf("request %d after the move, sent to the source: %+v; want it counted", i, o)
		}
	}
	if got := c.Retried(); got != 4 {
		t.Fatalf("%d requests sent again alone in all, want 4", got)
	}
	if err := valkeytest.WaitFor(ctx, 5*time.Second, "the slot map to load again and name the target", func() (bool, error) {
		addr, ok := tr.slots.primary(uint16(slot))
		return ok && addr == to.Addr && tr.slots.loads.Load() > loads, nil
	}); err != nil {
		t.Fatal(err)
	}
	wantCounts(t, tr.client, 3, moved, kept)
	if d := c.Route(moved, false); d.Node() != to.Addr {
		t.Fatalf("the moved key routes to %q, want the target %s", d.Node(), to.Addr)
	}

	if err := valkeytest.WaitFor(ctx, 5*time.Second, "the loads to settle", func() (bool, error) {
		return !tr.slots.loading.Load(), nil
	}); err != nil {
		t.Fatal(err)
	}
	loads = tr.slots.loads.Load()
	began := time.Now()
	for range 100 {
		tr.slots.reload()
	}
	if err := valkeytest.WaitFor(ctx, 5*time.Second, "the reloads to land", func() (bool, error) {
		return !tr.slots.loading.Load() && !tr.slots.dirty.Load(), nil
	}); err != nil {
		t.Fatal(err)
	}
	got := tr.slots.loads.Load() - loads
	if got < 1 || got > 2 {
		t.Fatalf("100 reloads in a row made %d loads, want 1 or 2", got)
	}
	if got == 2 && time.Since(began) < slotMapReloadEvery {
		t.Fatalf("two loads within %s, less than %s apart", time.Since(began), slotMapReloadEvery)
	}
}

// A call for a node the engine's client does not know, or whose connection cannot be opened
// (its process is gone), never left: each of its requests goes again alone, through the
// cluster client, and is taken once; a request over keys of several slots cannot, and comes
// back ErrNotTaken, nothing of it counted. So does one the node did not take because its slot
// map is stale.
func TestCallForAGoneNodeGoesAgainAlone(t *testing.T) {
	valkeytest.SkipIfShort(t, "starts a cluster")
	cl := valkeytest.NewCluster(t, 3, 0)
	tr := clusterTransport(t, cl, Ack{})
	ctx := context.Background()
	// A client of an address whose server is gone: every connection it opens is refused.
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
	nc := tr.slots.nodesSince(time.Now())
	clients := maps.Clone(nc.clients)
	clients[deadAddr] = gone
	tr.slots.nodes.Store(&nodeClients{at: time.Now().Add(time.Hour), clients: clients})

	c := NewCommit(tr, counting(false))
	for _, addr := range []string{deadAddr, "127.0.0.1:1"} {
		before := c.Retried()
		keys := keysOn(cl.Primaries[0], 3, -1)
		for i, o := range sendBatch(c, ctx, addr, each(keys...)...) {
			if o.Err != nil || !o.Recorded {
				t.Fatalf("batch for %s: request %d: %+v; want it counted", addr, i, o)
			}
		}
		if got := c.Retried() - before; got != int64(len(keys)) {
			t.Fatalf("batch for %s: %d requests sent again alone, want %d", addr, got, len(keys))
		}
		wantCounts(t, tr.client, 1, keys...)
	}

	// One script for any number of keys, as AllowAll's groups: a lone request goes to its
	// node.
	shared := NewCommit(tr, counting(true))
	oneSlot := []string{"{same}:" + uuid.NewString(), "{same}:" + uuid.NewString()}
	several := keysOn(cl.Primaries[0], 3, -1)
	for _, tc := range []struct {
		keys []string
		want error
	}{{oneSlot, nil}, {several, ErrNotTaken}} {
		o := shared.Do(ctx, tc.keys, Dest{node: "127.0.0.1:1"})
		if !errors.Is(o.Err, tc.want) || tc.want == nil && !o.Recorded {
			t.Fatalf("a request over %d keys for a gone node: %+v, want %v", len(tc.keys), o, tc.want)
		}
		want := int64(1)
		if tc.want != nil {
			want = 0
		}
		wantCounts(t, tr.client, want, tc.keys...)
	}
	// A stale slot map: every slot on the first primary, which does not serve the others'.
	if err := valkeytest.WaitFor(ctx, 5*time.Second, "the reloads to land", func() (bool, error) {
		return !tr.slots.loading.Load() && !tr.slots.dirty.Load(), nil
	}); err != nil {
		t.Fatal(err)
	}
	tr.slots.table.Store(&slotTable{addrs: []string{cl.Primaries[0].Addr}})
	spread := append(keysOn(cl.Primaries[0], 1, -1), keysOn(cl.Primaries[1], 1, -1)...)
	if o := shared.Do(ctx, spread, shared.Route(spread[0], false)); !errors.Is(o.Err, ErrNotTaken) {
		t.Fatalf("a request over two primaries' keys, on a stale map: %+v, want ErrNotTaken", o)
	}
	wantCounts(t, tr.client, 0, spread...)
	for _, k := range spread {
		if o := shared.Do(ctx, []string{k}, shared.BySlot(k)); o.Err != nil || !o.Recorded {
			t.Fatalf("the request's key %s, by its slot: %+v, want it counted", k, o)
		}
	}
	wantCounts(t, tr.client, 1, spread...)
}

// A batch call that may have run is never sent again: one that times out on a node that is
// paused (it was written; whether the node runs it is the node's affair) is each caller's
// error, no request of it goes again, and no key counts it more than once.
func TestBatchThatMayHaveRunIsNotSentAgain(t *testing.T) {
	valkeytest.SkipIfShort(t, "starts a cluster")
	cl := valkeytest.NewCluster(t, 3, 0)
	tr := clusterTransport(t, cl, Ack{})
	c, node := NewCommit(tr, counting(false)), cl.Primaries[2]
	keys := keysOn(node, 3, -1)
	// Warm the node's connection, so the call below is written at once.
	for i, o := range sendBatch(c, context.Background(), node.Addr, each(keys[:2]...)...) {
		if o.Err != nil || !o.Recorded {
			t.Fatalf("warm-up request %d: %+v; want it counted", i, o)
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
	for i, o := range sendBatch(c, ctx, node.Addr, each(keys...)...) {
		if !errors.Is(o.Err, context.DeadlineExceeded) {
			t.Fatalf("request %d on a paused node: %+v; want the deadline's error", i, o)
		}
	}
	if got := c.Retried(); got != 0 {
		t.Fatalf("%d requests of a call that may have run were sent again, want 0", got)
	}
	time.Sleep(time.Until(paused.Add(pause + 200*time.Millisecond)))
	for i, n := range counts(t, tr.client, keys...) {
		warm := int64(0)
		if i < 2 {
			warm = 1
		}
		if n < warm || n > warm+1 {
			t.Fatalf("%s counted %d times after %d warm-up requests and one call that timed out, want %d or %d", keys[i], n, warm, warm, warm+1)
		}
	}
}

// A batch sent to a node carries its acknowledgement as a call through the cluster client
// does: the WAIT goes behind it on the node's connection, once per call, and every request of
// the batch is held by the replica when its caller hears it acknowledged.
func TestBatchOnNodeWaitsForReplicas(t *testing.T) {
	valkeytest.SkipIfShort(t, "starts a cluster")
	cl := valkeytest.NewCluster(t, 3, 1)
	tr := clusterTransport(t, cl, Ack{Replicas: 1, Timeout: 2 * time.Second})
	c := NewCommit(tr, counting(false))
	ctx := context.Background()
	primary, replica := cl.Primaries[0], cl.Replicas[0]
	keys := keysOn(primary, 4, -1)
	pc := primary.Client()
	if err := pc.Do(ctx, pc.B().ConfigResetstat().Build()).Error(); err != nil {
		t.Fatal(err)
	}
	for i, o := range sendBatch(c, ctx, primary.Addr, each(keys...)...) {
		if o.Err != nil || !o.Recorded || o.Ack != nil {
			t.Fatalf("request %d: %+v; want it counted, one replica acknowledging it", i, o)
		}
	}
	stats := commandStats(t, primary)
	if stats["evalsha"].Calls+stats["eval"].Calls != 1 || stats["wait"].Calls != 1 {
		t.Fatalf("the primary ran %d script calls and %d WAIT; want one of each for the batch",
			stats["evalsha"].Calls+stats["eval"].Calls, stats["wait"].Calls)
	}
	rc := replica.Client()
	for _, k := range keys {
		rs := rc.DoMulti(ctx, rc.B().Readonly().Build(), rc.B().Exists().Key(k).Build())
		if n, err := rs[1].AsInt64(); err != nil || n != 1 {
			t.Fatalf("the replica holds %s: %d, %v; want it, acknowledged", k, n, err)
		}
	}
	// Asked for a replica more than there is, the count falls short within the timeout: the
	// request is recorded, and its acknowledgement says it is not held as asked.
	short := NewCommit(clusterTransport(t, cl, Ack{Replicas: 2, Timeout: 50 * time.Millisecond}), counting(false))
	key := keysOn(primary, 1, -1)[0]
	if o := short.Do(ctx, []string{key}, short.Route(key, false)); o.Err != nil || !o.Recorded ||
		o.Ack == nil || !strings.Contains(o.Ack.Error(), "1 of 2 replicas") {
		t.Fatalf("two replicas asked of one: %+v, want recorded and its acknowledgement short", o)
	}
}
