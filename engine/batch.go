package engine

import (
	"context"
	"errors"
	"fmt"
	"net"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/valkey-io/valkey-go"

	"github.com/strictrate/strictrate/loader"
)

// Group commit (WithBatching): a decision goes to the server at once when nothing waits for
// its destination; while earlier calls are in flight, decisions queue, and the next call
// carries all of them (up to maxBatch, maxBatchBytes) in one EVALSHA of the batch script. The
// script's fixed cost, its start and the server's clock, is then paid once per call, not per
// decision.
//
// A destination is the server; in a cluster, the primary that serves the keys' slots, by the
// engine's slot map (slots.go). A batch for a node goes to that node's connection with its
// keys undeclared (loader.Script.ExecOnNode: declared keys of several slots are refused), and
// the batch scripts' flag allow-cross-slot-keys lets them reach keys of every slot the node
// serves: with many keys, a batch still holds many decisions, where one per slot would hold
// about one. Until the slot map first lands, and for a slot no primary serves, the
// destination is the key's slot, and the call goes, keys declared, through the engine's
// client, which routes it and follows MOVED and ASK, as for a single decision.
//
// What a batch call's failure means for its decisions (retryAfterBatch): an error reply that
// the server gives before the script runs (the script did not run: nothing was decided), or a
// connection refused before anything was written, sends each decision again on its own, once,
// through the engine's client, which follows MOVED and ASK itself; and so does a decision the
// script could not take because its key is not on the node (its error reply inside the
// batch's reply). Any other failure, where the call may have run (a connection dropped once
// the call was written, a timeout), is each caller's error, as it is for a single decision: a
// decision is never taken twice.
//
// What a decision costs the client is kept small: calls and batches are pooled, with the
// slices a call is built in, so that a batched decision allocates nothing of its own here;
// and a committer goroutine that sends a batch sends the next one too, while batches keep
// coming, instead of starting a goroutine per batch.
const (
	// maxBatch is the most decisions one call carries.
	maxBatch = 128
	// maxBatchBytes bounds a call's keys and arguments, so that one call never holds the
	// server for long.
	maxBatchBytes = 32 << 10
	// maxInFlight is how many calls to one destination may be in flight at once. One makes
	// the largest batches; measured, two made them smaller and cost more per decision.
	maxInFlight = 1
	// maxGather bounds the yields before a batch is taken (gather).
	maxGather = 8
)

// call is a request in a committer's hands. Calls are pooled (newCall, release): a call goes
// back once its caller has read its outcome, or once it is taken out of its queue unsent; a
// call whose caller gave up on it after it was taken into a batch is left to the collector,
// since the batch still writes to it.
type call struct {
	ctx   context.Context
	req   request
	out   outcome
	sent  bool          // taken into a batch; under committer.mu
	done  chan struct{} // buffered, 1: receives once when out is set, for a call that waits in a queue
	alone [1]*call      // the call itself, when sent alone (sendOne)
	key   [1]string     // its KEYS, when sent alone
	args  []string      // its ARGV, when sent alone; kept for the next use
}

var callPool = sync.Pool{New: func() any { return &call{done: make(chan struct{}, 1)} }}

// newCall is a pooled call of req.
func newCall(ctx context.Context, req request) *call {
	cl := callPool.Get().(*call)
	cl.ctx, cl.req = ctx, req
	return cl
}

// release returns cl's outcome and puts cl back in the pool: nothing may hold cl any more.
func (cl *call) release() outcome {
	out := cl.out
	cl.ctx, cl.req, cl.out, cl.sent, cl.alone[0], cl.key[0] = nil, request{}, outcome{}, false, nil, ""
	clear(cl.args)
	callPool.Put(cl)
	return out
}

// readReply reads a reply to cl alone into its outcome; it reports whether it admits.
func (cl *call) readReply(reply valkey.ValkeyResult) bool {
	readDecisions(reply, cl.alone[:])
	return cl.out.admits()
}

// batch is a call of several requests, with what it is built in: pooled (getBatch), so that
// the slices of one batch serve the next.
type batch struct {
	calls   []*call
	keys    []string
	args    []string
	sets    []*limitSet
	setOf   []int
	retry   []*call // the calls to send again alone (retryAfterBatch)
	callErr error   // the last call's whole reply, when it was an error
}

var batchPool = sync.Pool{New: func() any { return new(batch) }}

func getBatch() *batch { return batchPool.Get().(*batch) }

// put clears b, so that the pool holds on to no call or key, and puts it back.
func (b *batch) put() {
	clear(b.calls)
	b.calls = b.calls[:0]
	clear(b.retry)
	b.retry, b.callErr = b.retry[:0], nil
	batchPool.Put(b)
}

// readReply reads a reply to b into its calls' outcomes, and keeps the call's error, if its
// whole reply is one; it reports whether any admits.
func (b *batch) readReply(reply valkey.ValkeyResult) bool {
	b.callErr = reply.Error()
	readDecisions(reply, b.calls)
	return slices.ContainsFunc(b.calls, func(cl *call) bool { return cl.out.admits() })
}

// committer batches the requests bound for one script's destinations.
type committer struct {
	e      *Engine
	single *loader.Script // a call of one request
	batch  *loader.Script // a call of several
	ack    bool           // send each writing call with WAIT and/or WAITAOF (after an admission)
	slots  *slotMap       // in a cluster, where each slot's batches go; nil otherwise

	// retried counts the decisions sent again on their own after their batch call (or their
	// part of it) did not run: see retryAfterBatch.
	retried atomic.Int64

	mu     sync.Mutex
	queues map[queueKey]*queue
}

// queueKey names a destination: a cluster's primary (node), or else a slot (in a cluster whose
// slot map has not landed, or a slot no primary serves; 0 for a standalone server), and whose
// clock its requests take (a batch reads the server's clock once for all its requests, or
// takes each one's).
type queueKey struct {
	node string
	slot uint16
	each bool
}

// queue is one destination's calls in flight and requests waiting.
type queue struct {
	node     string // the address of the primary its batches go to; "" for the engine's client
	inFlight int
	waiting  []*call
}

func newCommitter(e *Engine, single, batch *loader.Script) *committer {
	c := &committer{e: e, single: single, batch: batch, ack: e.ackPolicy.on() && !single.ReadOnly(),
		queues: map[queueKey]*queue{}}
	// Peeks keep to their slots, through the engine's client: it is the client that sends
	// read-only scripts to replicas when asked to (SendPeeksToReplicas), which a batch sent to
	// a primary's connection would ignore.
	if e.client.Mode() == valkey.ClientModeCluster && !single.ReadOnly() {
		c.slots = newSlotMap(e.client)
	}
	return c
}

// queue returns the queue of req's destination (queueKey).
func (c *committer) queue(req *request) *queue {
	var k queueKey
	if c.slots != nil {
		cmd := valkey.Completed{}.SetSlot(req.key)
		if addr, ok := c.slots.primary(cmd.Slot()); ok {
			k.node = addr
		} else {
			k.slot = cmd.Slot()
		}
	}
	k.each = req.now != ""
	q := c.queues[k]
	if q == nil {
		q = &queue{node: k.node}
		c.queues[k] = q
	}
	return q
}

// do takes req: without batching (WithBatching(false)) in a call of its own; with it, alone
// at once when its destination is idle, else in the next batch. A caller whose context ends
// while req waits takes it out, and it is never sent; once sent, it may still be applied,
// once.
func (c *committer) do(ctx context.Context, req request) outcome {
	cl := newCall(ctx, req)
	if !c.e.batching {
		c.sendOne(ctx, cl)
		return cl.release()
	}
	c.mu.Lock()
	q := c.queue(&cl.req)
	if q.inFlight < maxInFlight && len(q.waiting) == 0 {
		q.inFlight++
		c.mu.Unlock()
		// Counted out however the call ends, a panic included: a call left counted in flight
		// would hold every later decision of this destination in the queue for good.
		defer c.sentAlone(ctx, q)
		cl.sent = true
		c.sendOne(ctx, cl)
		return cl.release()
	}
	q.waiting = append(q.waiting, cl)
	c.mu.Unlock()
	select {
	case <-cl.done:
		return cl.release()
	case <-ctx.Done():
		c.mu.Lock()
		sent := cl.sent
		if !sent {
			if i := slices.Index(q.waiting, cl); i >= 0 {
				q.waiting = slices.Delete(q.waiting, i, i+1)
			}
		}
		c.mu.Unlock()
		if !sent {
			cl.release() // in no queue and no batch: nothing holds it
		}
		return outcome{err: ctx.Err()}
	}
}

// take moves the next batch from q's waiting requests into b.calls and counts it in flight;
// false when none waits. Under c.mu.
func (c *committer) take(q *queue, b *batch) bool {
	if len(q.waiting) == 0 {
		return false
	}
	n, size := 0, 0
	for n < len(q.waiting) && n < maxBatch {
		size += q.waiting[n].req.size()
		if n > 0 && size > maxBatchBytes {
			break
		}
		n++
	}
	b.calls = append(b.calls[:0], q.waiting[:n]...)
	rest := copy(q.waiting, q.waiting[n:])
	clear(q.waiting[rest:])
	q.waiting = q.waiting[:rest]
	for _, cl := range b.calls {
		cl.sent = true
	}
	q.inFlight++
	return true
}

// sentAlone counts a call of one request, sent by its caller, that came back; and hands the
// next batch, if one waits, to a committer goroutine (sendTaken).
func (c *committer) sentAlone(ctx context.Context, q *queue) {
	c.recordBatch(ctx, 1)
	c.mu.Lock()
	q.inFlight--
	var next *batch
	if len(q.waiting) > 0 {
		next = getBatch()
		c.take(q, next)
	}
	c.mu.Unlock()
	if next != nil {
		go c.sendTaken(q, next)
	}
}

// recordBatch counts a call of n requests.
func (c *committer) recordBatch(ctx context.Context, n int) {
	op := opAllow
	if c.single.ReadOnly() {
		op = opPeek
	}
	c.e.metrics.batchSize.Record(ctx, int64(n), c.e.metrics.byOp[op]...)
}

// sendTaken sends b, a batch taken from q, and then each next batch q holds when the one
// before comes back, until none waits: one goroutine for as long as batches follow each
// other, not one per batch.
func (c *committer) sendTaken(q *queue, b *batch) {
	defer b.put()
	for {
		c.sendCalls(q, b)
		c.gather(q)
		c.mu.Lock()
		q.inFlight--
		more := c.take(q, b)
		c.mu.Unlock()
		if !more {
			return
		}
	}
}

// gather lets the callers of the batch that just came back run before the next batch is
// taken from q: each caller that decides again at once (a loop, a handler serving its next
// request) joins the next batch instead of the one after. It yields the processor while q's
// waiting calls keep growing, at most maxGather times: when nobody comes back it costs one
// yield. Measured (go run ./bench -scenario cluster: 64 goroutines over 4 clients, so about
// five per client and node), it took batches from 2.8 to 3.7 decisions per call.
func (c *committer) gather(q *queue) {
	c.mu.Lock()
	n := len(q.waiting)
	c.mu.Unlock()
	for range maxGather {
		runtime.Gosched()
		c.mu.Lock()
		grown := len(q.waiting)
		c.mu.Unlock()
		if grown <= n {
			return
		}
		n = grown
	}
}

// sendCalls runs b's calls, taken from q, as one call to the server, under a context that
// lasts as long as its most patient caller's (none of them may cut the call short for the
// others), hands each caller its outcome, and counts the calls made. It runs on a goroutine of
// the committer's, where a panic would end the process and leave the callers waiting: one is
// handed to every caller of the batch as its error instead.
func (c *committer) sendCalls(q *queue, b *batch) {
	ctx, cancel := batchContext(b.calls, func(cl *call) context.Context { return cl.ctx })
	defer func() {
		if p := recover(); p != nil {
			err := fmt.Errorf("strictrate: the batch call failed: panic: %v", p)
			for _, cl := range b.calls {
				cl.out = outcome{err: err}
			}
		}
		cancel()
		// Once signalled, a call is its caller's again (and may be pooled and reused at once):
		// nothing here reads it after.
		for _, cl := range b.calls {
			cl.done <- struct{}{}
		}
	}()
	if len(b.calls) == 1 {
		c.sendOne(ctx, b.calls[0])
		c.recordBatch(context.Background(), 1)
		return
	}
	c.sendBatch(ctx, q, b)
}

// sendBatch sends b's requests, several, as one call of the batch script to q's destination,
// then each request that call did not take (retryAfterBatch) again on its own.
func (c *committer) sendBatch(ctx context.Context, q *queue, b *batch) {
	var node valkey.Client
	if q.node != "" {
		if node = c.slots.nodeClient(q.node); node == nil {
			// The engine's client no longer knows the node (it left the cluster, say):
			// nothing was sent.
			c.slots.reload()
			c.retryAlone(ctx, b.calls)
			return
		}
	}
	c.sendTo(ctx, b, node)
	retry := c.retryAfterBatch(b)
	if taken := len(b.calls) - len(retry); taken > 0 {
		c.recordBatch(context.Background(), taken)
	}
	if len(retry) > 0 {
		if c.slots != nil {
			c.slots.reload() // a slot moved, or its node is gone
		}
		c.retryAlone(ctx, retry)
	}
}

// retryAfterBatch returns the requests of b, just sent, that its call did not take and that
// are safe to send again, in b.retry: all of them when the call failed before the script ran,
// else those the script could not take for their key's node. Each one named here was not
// decided, so sending it again decides it once:
//
//   - MOVED, ASK, TRYAGAIN, CROSSSLOT, CLUSTERDOWN: the server refused the call for its keys'
//     slots before running it (a slot moved or is moving, the cluster is down);
//   - READONLY: the node is a replica now (a failover), and refuses a script that may write
//     before running it;
//   - OOM: the server is over maxmemory and refuses the batch script before it runs (its flags
//     lack allow-oom); alone, decide.lua still decides a key whose log needs no more memory;
//   - a connection that could not be opened (a net.OpError of Op "dial": a node that is gone),
//     so nothing was written;
//   - inside the reply, one request's error saying its key is not on the node ("non local
//     key": another node's slot, or a migrating one whose key moved) or that the cluster is
//     down: the server refused the request's first command on its key, and so every command
//     on it (lib_keys.lua says why nothing of it counts).
//
// Everything else is each caller's: a connection dropped or reset after the call was written,
// a timeout, valkey.ErrClosing (a closed connection, which may have taken the call before it
// closed), any other error reply. The call may have run, and a second call could decide the
// same request twice.
func (c *committer) retryAfterBatch(b *batch) []*call {
	b.retry = b.retry[:0]
	if b.callErr != nil {
		if refusedBeforeRun(b.callErr) {
			b.retry = append(b.retry, b.calls...)
		}
		return b.retry
	}
	for _, cl := range b.calls {
		if cl.out.err != nil && notTakenOnNode(cl.out.err) {
			b.retry = append(b.retry, cl)
		}
	}
	return b.retry
}

// beforeRunReplies are the error replies a server gives a script call before it runs it,
// which retryAfterBatch sends again decision by decision.
var beforeRunReplies = []string{"MOVED ", "ASK ", "TRYAGAIN", "CROSSSLOT", "CLUSTERDOWN", "READONLY", "OOM "}

// refusedBeforeRun reports whether err, a batch call's whole reply, says the call never ran:
// one of beforeRunReplies, or a connection that could not be opened.
func refusedBeforeRun(err error) bool {
	if verr, ok := valkey.IsValkeyErr(err); ok {
		for _, prefix := range beforeRunReplies {
			if strings.HasPrefix(verr.Error(), prefix) {
				return true
			}
		}
		return false
	}
	var op *net.OpError
	return errors.As(err, &op) && op.Op == "dial"
}

// notLocalReplies are what a script's command on a key answers when the node cannot serve the
// key (scriptVerifyClusterState in the server): inside a batch's reply, the error of a request
// whose key is not on the node.
var notLocalReplies = []string{"Script attempted to access a non local key in a cluster node",
	"Script attempted to execute a command while the cluster is down",
	"Script attempted to execute a write command while the cluster is down"}

// notTakenOnNode reports whether err, one request's error inside a batch's reply, says the
// node could not serve its key (notLocalReplies), so the request was not taken.
func notTakenOnNode(err error) bool {
	if _, ok := valkey.IsValkeyErr(err); !ok {
		return false
	}
	for _, reply := range notLocalReplies {
		if strings.Contains(err.Error(), reply) {
			return true
		}
	}
	return false
}

// retryAlone sends each of calls again on its own, through the engine's client (which follows
// MOVED and ASK), each on a goroutine of its own when there are several, and returns once all
// came back. Each was not decided (retryAfterBatch), and is sent once.
func (c *committer) retryAlone(ctx context.Context, calls []*call) {
	c.retried.Add(int64(len(calls)))
	for _, cl := range calls {
		cl.out = outcome{}
	}
	if len(calls) == 1 {
		c.sendOne(ctx, calls[0])
	} else {
		var wg sync.WaitGroup
		for _, cl := range calls {
			wg.Go(func() {
				// Not the committer's goroutine: a panic here is this caller's error.
				defer func() {
					if p := recover(); p != nil {
						cl.out = outcome{err: fmt.Errorf("strictrate: a decision sent again alone failed: panic: %v", p)}
					}
				}()
				c.sendOne(ctx, cl)
			})
		}
		wg.Wait()
	}
	for range calls {
		c.recordBatch(context.Background(), 1)
	}
}

// batchContext is the context of a call of calls: it ends at the latest deadline of theirs,
// and not at all when one of them has none.
func batchContext[T any](calls []T, ctxOf func(T) context.Context) (context.Context, context.CancelFunc) {
	var latest time.Time
	for _, cl := range calls {
		deadline, ok := ctxOf(cl).Deadline()
		if !ok {
			return context.Background(), func() {}
		}
		if deadline.After(latest) {
			latest = deadline
		}
	}
	return context.WithDeadline(context.Background(), latest)
}

// sendOne sends one request as a call of the single script.
func (c *committer) sendOne(ctx context.Context, cl *call) {
	cl.alone[0] = cl // a batch of one, without allocating its slice
	cl.key[0] = cl.req.key
	cl.args = append(cl.args[:0], cl.req.singleArg())
	c.exec(ctx, c.single, cl.key[:], cl.args, cl.alone[:], cl)
}

// replyReader reads a decision script's reply into the outcomes of the requests a call
// carries, and reports whether any of them admits.
type replyReader interface {
	readReply(valkey.ValkeyResult) (admits bool)
}

// exec runs s with keys and args and the acknowledgements asked for (execAckedTo: one WAIT per
// call, and one WAITAOF per call that admitted something, whatever the decisions it carries),
// and reads the reply with r into the outcomes of calls, the requests it carries in KEYS order.
func (c *committer) exec(ctx context.Context, s *loader.Script, keys, args []string, calls []*call, r replyReader) {
	ack := c.e.execAckedTo(ctx, s, c.ack, keys, args, r)
	for _, cl := range calls {
		cl.out.ack = ack
	}
}

// send sends b's requests, several, as one call of the batch script through the engine's
// client, the keys declared (sendTo with no node).
func (c *committer) send(ctx context.Context, b *batch) { c.sendTo(ctx, b, nil) }

// sendTo sends b's requests, several, as one call of the batch script: to node, a client of the
// primary that serves their slots, with the keys undeclared (loader.Script.ExecOnNode); or,
// when node is nil, through the engine's client with the keys declared. b.callErr holds the
// call's error, if its whole reply was one.
func (c *committer) sendTo(ctx context.Context, b *batch, node valkey.Client) {
	calls := b.calls
	// The limit sets of the batch, each once; requests name theirs by its position.
	sets, setOf := b.sets[:0], slices.Grow(b.setOf[:0], len(calls))[:len(calls)]
	for i, cl := range calls {
		setOf[i] = -1
		for j, s := range sets {
			if s.sameLimits(cl.req.set) {
				setOf[i] = j
				break
			}
		}
		if setOf[i] < 0 {
			setOf[i] = len(sets)
			sets = append(sets, cl.req.set)
		}
	}
	clock := ""
	if calls[0].req.now != "" {
		clock = "each"
	}
	keys := slices.Grow(b.keys[:0], len(calls))
	args := slices.Grow(b.args[:0], 2+(1+2*len(sets[0].limits))*len(sets)+3*len(calls))
	args = append(args, clock, itoa(len(sets)))
	for _, s := range sets {
		args = append(args, itoa(len(s.nums)))
		args = append(args, s.nums...)
	}
	for i, cl := range calls {
		keys = append(keys, cl.req.key)
		args = append(args, cl.req.cost, itoa(setOf[i]+1))
		if clock != "" {
			args = append(args, cl.req.now)
		}
	}
	b.keys, b.args, b.sets, b.setOf = keys, args, sets, setOf
	b.callErr = nil
	if node != nil {
		ack := c.e.execAckedOnNode(ctx, node, c.batch, c.ack, keys, args, b)
		for _, cl := range calls {
			cl.out.ack = ack
		}
	} else {
		c.exec(ctx, c.batch, keys, args, calls, b)
	}
	clear(keys)
	clear(args)
	clear(sets)
}

// smallInts are the numbers a batch's arguments count with (sets, limits, positions), formatted.
var smallInts = func() (s [maxBatch + 1]string) {
	for i := range s {
		s[i] = strconv.Itoa(i)
	}
	return s
}()

// itoa formats n, without allocating when it is at most maxBatch.
func itoa(n int) string {
	if n >= 0 && n < len(smallInts) {
		return smallInts[n]
	}
	return strconv.Itoa(n)
}
