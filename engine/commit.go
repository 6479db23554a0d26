package engine

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/valkey-io/valkey-go"

	"github.com/strictrate/strictrate/internal/sendctx"
	"github.com/strictrate/strictrate/loader"
)

// Every script call the engine makes is a request handed to a group commit (commit), and
// every call of a script is made by one function (commit.exec). A commit is generic over what
// its requests carry (a decision or a peek, an AllowAll group, a settle, a lease call: a kind),
// and a kind differs from another only by its scripts, its wire functions (wire.go,
// wire_kinds.go) and two rules: how much fits in one call (the size rule) and which requests
// a call did not take go again alone (the retry rule, commit_retry.go).
//
// Group commit (WithBatching): a request goes to the server at once when nothing of its kind
// waits for its destination; while a call is in flight there, requests queue, and the next
// call carries all of them (up to maxBatch requests or keys, and maxBatchBytes) in one EVALSHA
// of the kind's batch script. The script's fixed cost, its start and the server's clock, is
// then paid once per call, not per request. A kind without a batch script (settles, leases)
// sends each request at once, in a call of its own.
//
// A destination is the server; in a cluster, the primary that serves the keys' slots, by the
// engine's slot map (slots.go). A batch for a node goes to that node's connection with its
// keys undeclared (loader.Call.Undeclared: declared keys of several slots are refused), and
// the batch scripts' flag allow-cross-slot-keys lets them reach keys of every slot the node
// serves. Until the slot map first lands, and for a slot no primary serves, the destination is
// the key's slot, and the call goes, keys declared, through the engine's client, which routes
// it and follows MOVED and ASK, as for a single request.
//
// What a request costs the client is kept small: calls are pooled, with the slices a call is
// built in, so that a batched decision allocates nothing of its own here; and a committer
// goroutine that sends a batch sends the next one too, while batches keep coming, instead of
// starting a goroutine per batch.

// The group commit's bounds, shared by every kind.
const (
	// maxBatch is the most requests (for AllowAll groups, keys) one call carries.
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

// kind is one kind of request, as the group commit and its execution function see it.
type kind[T any] struct {
	op     operation      // counted in the batch-size metric under this operation
	single *loader.Script // a call of one request
	batch  *loader.Script // a call of several; nil: one request per call, never queued
	// acked says its calls may admit (a decision, an acquire), and so wait for the
	// acknowledgements the engine asks for (WithReplicaAck, WithDurableAck); a settle or a
	// release gives back, and waits for none.
	acked bool
	// encode lays out a call of calls in keys and args (wire.go): the batch script's when it
	// carries several.
	encode func(calls []*call[T], keys, args []string) ([]string, []string)
	// decode reads a call's reply into each call's outcome (wire.go), and reports whether
	// the call recorded anything (which WithDurableAck then confirms with WAITAOF).
	decode func(reply valkey.ValkeyResult, calls []*call[T]) (recorded bool)
	// size is the size rule: what a request adds to a call, in requests (or keys) against
	// maxBatch, and in bytes against maxBatchBytes.
	size func(c *call[T]) (count, bytes int)
	// retry is the retry rule: whether a request that its batch's call did not take (the
	// call's whole error, callErr, or else its own) may go again alone; nil: never.
	retry func(callErr error, c *call[T]) bool
}

// call is one request in the group commit's hands: what it carries (req, whose outcome the
// kind's decode fills in), where it goes, its caller's context, and what came back. Calls are
// pooled (get, release): a call goes back once its caller has read its outcome, or once it is
// taken out of its queue unsent; a call whose caller gave up on it after it was taken into a
// batch is left to the collector, since the batch still writes to it.
type call[T any] struct {
	ctx  context.Context
	req  T
	dest destination
	err  error      // the call failed, or this request alone (an error reply)
	ack  ackReplies // what the acknowledgements behind its call answered
	sent bool       // taken into a batch; under commit.mu
	done chan struct{}
	// A call sent alone is a batch of one, built in these without allocating.
	alone [1]*call[T]
	built scratch
}

// scratch is what a call's keys and arguments are laid out in, kept from one use to the next.
type scratch struct {
	keys, args []string
}

// destination names where a call goes: a cluster's primary (node), or else a slot (in a
// cluster whose slot map has not landed, or a slot no primary serves; 0 for a standalone
// server), and whose clock its requests take (a batch reads the server's clock once for all
// its requests, or takes each one's).
type destination struct {
	node string
	slot uint16
	each bool
}

// queue is one destination's calls in flight and requests waiting.
type queue[T any] struct {
	node     string // the address of the primary its batches go to; "" for the engine's client
	inFlight int
	waiting  []*call[T]
}

// batch is a call of several requests, with what it is built in: pooled, so that the slices
// of one batch serve the next.
type batch[T any] struct {
	calls []*call[T]
	retry []*call[T]
	built scratch
}

// commit is the group commit of one kind of request.
type commit[T any] struct {
	e     *Engine
	kind  kind[T]
	ack   bool     // send each writing call with WAIT and/or WAITAOF
	slots *slotMap // in a cluster, where each slot's batches go; nil otherwise

	// retried counts the requests sent again on their own after their batch call (or their
	// part of it) did not take them.
	retried atomic.Int64

	calls   sync.Pool
	batches sync.Pool

	mu     sync.Mutex
	queues map[destination]*queue[T]
}

// newCommit makes the group commit of k. routed batches go to the primary of their keys'
// slots in a cluster (decisions, AllowAll groups); peeks keep to their slots, through the
// engine's client: it is the client that sends read-only scripts to replicas when asked to
// (SendPeeksToReplicas), which a batch sent to a primary's connection would ignore.
func newCommit[T any](e *Engine, k kind[T], slots *slotMap) *commit[T] {
	c := &commit[T]{e: e, kind: k, ack: e.ackPolicy.on() && k.acked, slots: slots,
		queues: map[destination]*queue[T]{}}
	c.calls.New = func() any { return &call[T]{done: make(chan struct{}, 1)} }
	c.batches.New = func() any { return new(batch[T]) }
	return c
}

// route is the destination of a request on key: in a cluster, the primary that serves its
// slot by the slot map, else the slot; each says it takes its own clock.
func (c *commit[T]) route(key string, each bool) destination {
	d := destination{each: each}
	if c.slots != nil {
		slot := slotOf(key)
		if addr, ok := c.slots.primary(slot); ok {
			d.node = addr
		} else {
			d.slot = slot
		}
	}
	return d
}

// do takes req, bound for dest: without batching (WithBatching(false)), or for a kind that
// never batches, in a call of its own; else alone at once when its destination is idle, or in
// the next batch. A caller whose context has ended sends nothing; one whose context ends while
// req waits takes it out, and it is never sent; once sent, it may still be applied, once. It returns the call, whose outcome is the
// caller's to read and then release.
func (c *commit[T]) do(ctx context.Context, req T, dest destination) *call[T] {
	if ctx.Err() != nil {
		// The caller has gone already (a gRPC call whose deadline passed before its
		// interceptor ran, say): nothing is sent, so nothing is decided on its behalf.
		return c.leftBehind(ctx, req)
	}
	cl := c.calls.Get().(*call[T])
	cl.ctx, cl.req, cl.dest = ctx, req, dest
	if !c.e.batching || c.kind.batch == nil {
		return c.sendPromptly(ctx, cl, nil)
	}
	c.mu.Lock()
	q := c.queue(dest)
	if q.inFlight < maxInFlight && len(q.waiting) == 0 {
		q.inFlight++
		cl.sent = true
		c.mu.Unlock()
		return c.sendPromptly(ctx, cl, q)
	}
	q.waiting = append(q.waiting, cl)
	c.mu.Unlock()
	select {
	case <-cl.done:
		return cl
	case <-ctx.Done():
		c.mu.Lock()
		sent := cl.sent
		if !sent {
			if i := slices.Index(q.waiting, cl); i >= 0 {
				q.waiting = slices.Delete(q.waiting, i, i+1)
			}
		}
		c.mu.Unlock()
		if sent {
			return c.leftBehind(ctx, req)
		}
		cl.err = ctx.Err()
		return cl
	}
}

// leftBehind is the call a caller whose context ended gets once its request was sent: one of
// its own, with the context's error, since the call sent still writes to the one it left.
func (c *commit[T]) leftBehind(ctx context.Context, req T) *call[T] {
	cl := c.calls.Get().(*call[T])
	cl.req, cl.err = req, ctx.Err()
	return cl
}

// sendPromptly sends cl alone, and returns when it comes back or when ctx ends, whichever is
// first; q, when not nil, is the queue that counts it in flight (sentAlone counts it out).
// A context that can end gets the call sent on a goroutine of its own while its caller
// waits: valkey-go honours a context while a call waits in a connection's queue, but not
// while the connection it needs is dialled and greets the server (HELLO), which on a server
// that takes connections and does not answer (paused, or overloaded) lasts the dial timeout,
// nor while a call waits for another's dial of that connection. The caller that leaves gets
// its context's error; the call, once sent, may still be applied, once, as for a caller that
// leaves a batch.
func (c *commit[T]) sendPromptly(ctx context.Context, cl *call[T], q *queue[T]) *call[T] {
	if ctx.Done() == nil {
		if q != nil {
			// Counted out however the call ends, a panic included: a call left counted in
			// flight would hold every later request of this destination in the queue for good.
			defer c.sentAlone(ctx, q)
		}
		c.sendAlone(ctx, cl)
		return cl
	}
	req := cl.req
	go func() {
		defer func() {
			if p := recover(); p != nil {
				cl.err = fmt.Errorf("strictrate: the call failed: panic: %v", p)
			}
			if q != nil {
				c.sentAlone(context.WithoutCancel(ctx), q)
			}
			// Once signalled, the call is its caller's again, or the collector's if the
			// caller left: nothing here reads it after.
			cl.done <- struct{}{}
		}()
		c.sendAlone(ctx, cl)
	}()
	select {
	case <-cl.done:
		return cl
	case <-ctx.Done():
		return c.leftBehind(ctx, req)
	}
}

// release puts cl back in the pool: nothing may hold it any more.
func (c *commit[T]) release(cl *call[T]) {
	var zero T
	cl.ctx, cl.req, cl.dest, cl.err, cl.ack, cl.sent, cl.alone[0] = nil, zero, destination{}, nil, ackReplies{}, false, nil
	c.calls.Put(cl)
}

// queue returns the queue of dest. Under c.mu.
func (c *commit[T]) queue(dest destination) *queue[T] {
	q := c.queues[dest]
	if q == nil {
		q = &queue[T]{node: dest.node}
		c.queues[dest] = q
	}
	return q
}

// take moves the next batch from q's waiting requests into b.calls, by the size rule, and
// counts it in flight; false when none waits. Under c.mu.
func (c *commit[T]) take(q *queue[T], b *batch[T]) bool {
	if len(q.waiting) == 0 {
		return false
	}
	n, count, bytes := 0, 0, 0
	for n < len(q.waiting) {
		k, size := c.kind.size(q.waiting[n])
		count, bytes = count+k, bytes+size
		if n > 0 && (count > maxBatch || bytes > maxBatchBytes) {
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
func (c *commit[T]) sentAlone(ctx context.Context, q *queue[T]) {
	c.recordBatch(ctx, 1)
	c.mu.Lock()
	q.inFlight--
	var next *batch[T]
	if len(q.waiting) > 0 {
		next = c.batches.Get().(*batch[T])
		c.take(q, next)
	}
	c.mu.Unlock()
	if next != nil {
		go c.sendTaken(q, next)
	}
}

// recordBatch counts a call of n requests.
func (c *commit[T]) recordBatch(ctx context.Context, n int) {
	c.e.metrics.batchSize.Record(ctx, int64(n), c.e.metrics.byOp[c.kind.op]...)
}

// sendTaken sends b, a batch taken from q, and then each next batch q holds when the one
// before comes back, until none waits: one goroutine for as long as batches follow each
// other, not one per batch.
func (c *commit[T]) sendTaken(q *queue[T], b *batch[T]) {
	defer func() {
		clear(b.calls)
		b.calls = b.calls[:0]
		c.batches.Put(b)
	}()
	for {
		c.sendBatch(q, b)
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
func (c *commit[T]) gather(q *queue[T]) {
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

// sendBatch runs b's calls, taken from q, as one call to the server, under a context that
// lasts as long as its most patient caller's (none of them may cut the call short for the
// others); sends each request its call did not take (the retry rule) again alone; hands each
// caller its outcome; and counts the calls made. It runs on a goroutine of the committer's,
// where a panic would end the process and leave the callers waiting: one is handed to every
// caller of the batch as its error instead.
func (c *commit[T]) sendBatch(q *queue[T], b *batch[T]) {
	ctx, cancel := batchContext(b.calls)
	defer func() {
		if p := recover(); p != nil {
			err := fmt.Errorf("strictrate: the batch call failed: panic: %v", p)
			for _, cl := range b.calls {
				cl.err = err
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
		c.sendAlone(ctx, b.calls[0])
		c.recordBatch(context.Background(), 1)
		return
	}
	node, gone := c.nodeFor(b.calls[0].dest, len(b.calls))
	if gone {
		// The engine's client no longer knows the node (it left the cluster, say): nothing was
		// sent.
		c.slots.reload()
		if c.kind.retry != nil {
			c.retryAlone(ctx, b.calls)
			return
		}
		for _, cl := range b.calls {
			cl.err = errNodeGone
		}
		return
	}
	callErr := c.exec(ctx, node, b.calls, &b.built)
	retry := b.retry[:0]
	if c.kind.retry != nil {
		for _, cl := range b.calls {
			if c.kind.retry(callErr, cl) {
				retry = append(retry, cl)
			}
		}
	}
	b.retry = retry
	if taken := len(b.calls) - len(retry); taken > 0 {
		c.recordBatch(context.Background(), taken)
	}
	if len(retry) > 0 {
		if c.slots != nil {
			c.slots.reload() // a slot moved, or its node is gone
		}
		c.retryAlone(ctx, retry)
	}
	clear(b.retry)
}

// sendAlone sends one request as a call of the kind's single script: through the engine's
// client, the keys declared, or, for a kind whose one script takes any number of requests
// and reads its keys undeclared (AllowAll's groups, whose keys may be of several slots of a
// primary), to its destination's node.
func (c *commit[T]) sendAlone(ctx context.Context, cl *call[T]) {
	cl.err, cl.ack = nil, ackReplies{}
	node, gone := c.nodeFor(cl.dest, 1)
	if gone {
		c.slots.reload()
		cl.err = errNodeGone
		return
	}
	cl.alone[0] = cl
	c.exec(ctx, node, cl.alone[:], &cl.built)
}

// nodeFor returns the client of dest's node for a call of n requests: a batch for a primary,
// or a lone request of a kind whose one script takes any number (it reads its keys
// undeclared); nil for the engine's client, which routes by the keys, declared. gone reports
// a node the engine's client no longer knows.
func (c *commit[T]) nodeFor(dest destination, n int) (node valkey.Client, gone bool) {
	if dest.node == "" || n == 1 && c.kind.single != c.kind.batch {
		return nil, false
	}
	node = c.slots.nodeClient(dest.node)
	return node, node == nil
}

// errNodeGone is the error of a call for a node the engine's client no longer knows: nothing
// was sent.
var errNodeGone = errors.New("strictrate: the node is no longer in the cluster client's topology")

// batchContext is the context of a call of calls: it ends at the latest deadline of theirs,
// and not at all when one of them has none.
func batchContext[T any](calls []*call[T]) (context.Context, context.CancelFunc) {
	var latest time.Time
	for _, cl := range calls {
		deadline, ok := cl.ctx.Deadline()
		if !ok {
			return context.Background(), func() {}
		}
		if deadline.After(latest) {
			latest = deadline
		}
	}
	return context.WithDeadline(context.Background(), latest)
}

// exec is the one function that calls a script: it runs calls (one request, or several of c's
// kind bound for one destination) as one call of the kind's script, laid out by the kind's
// encode in built's slices, through node (a cluster primary's
// client, the keys undeclared) or, when node is nil, the engine's client (the keys declared),
// on ctx without its deadline (loader.Script.Exec), with the acknowledgements the engine asks
// for: WAIT in the same round trip, and with WithDurableAck, on a connection held for the call,
// WAITAOF right after the reply when the call recorded something. The kind's decode reads
// the reply into each request's outcome; each call gets the call's error, if its whole reply
// was one, and what the acknowledgements answered. It returns the call's error.
func (c *commit[T]) exec(ctx context.Context, node valkey.Client, calls []*call[T], built *scratch) error {
	s := c.kind.single
	if len(calls) > 1 {
		s = c.kind.batch
	}
	keys, args := c.kind.encode(calls, built.keys[:0], built.args[:0])
	var client valkey.Client = c.e.client
	if node != nil {
		client = node
	}
	lc := loader.Call{Keys: keys, Args: args, Undeclared: node != nil}
	var reply valkey.ValkeyResult
	var got ackReplies
	switch {
	case !c.ack:
		reply, _ = s.Exec(ctx, client, lc)
		c.kind.decode(reply, calls)
	case !c.e.ackPolicy.waitAOF():
		lc.Then = c.e.ackPolicy.inline
		var after []valkey.ValkeyResult
		reply, after = s.Exec(ctx, client, lc)
		got = c.e.ackPolicy.readInline(after)
		c.kind.decode(reply, calls)
	default:
		// WAITAOF waits for the writes of the connection it is sent on: the call's own, so
		// both go on one connection held for the call.
		lc.Then = c.e.ackPolicy.inline
		_ = client.Dedicated(func(dc valkey.DedicatedClient) error {
			var after []valkey.ValkeyResult
			reply, after = s.Exec(ctx, dc, lc)
			got = c.e.ackPolicy.readInline(after)
			if c.kind.decode(reply, calls) && reply.Error() == nil {
				got = c.e.ackPolicy.readAfter(got, dc.Do(sendctx.Of(ctx), c.e.ackPolicy.afterAdmission(dc.B())))
			}
			return nil
		})
	}
	callErr := reply.Error()
	for _, cl := range calls {
		cl.ack = got
		if callErr != nil {
			cl.err = callErr
		}
	}
	clear(keys)
	clear(args)
	built.keys, built.args = keys, args
	return callErr
}
