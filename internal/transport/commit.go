package transport

import (
	"context"
	"fmt"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/valkey-io/valkey-go"

	"github.com/strictrate/strictrate/internal/callerr"
	"github.com/strictrate/strictrate/internal/sendctx"
	"github.com/strictrate/strictrate/loader"
)

// Group commit: a request goes to the server at once when nothing of its kind waits for its
// destination; while a call is in flight there, requests queue, and the next call carries all
// of them (up to MaxBatch requests or keys, and maxBatchBytes) in one EVALSHA of the kind's
// batch script. The script's fixed cost, its start and the server's clock, is then paid once
// per call, not per request. A kind without a batch script (settles, leases) sends each
// request at once, in a call of its own.
//
// A batch for a node goes to that node's connection with its keys undeclared
// (loader.Call.Undeclared: declared keys of several slots are refused), and the batch scripts'
// flag allow-cross-slot-keys lets them reach keys of every slot the node serves.
//
// What a request costs is kept small: calls are pooled, with the slices a call is built in,
// so that a batched request allocates nothing of its own here; and a committer goroutine that
// sends a batch sends the next one too, while batches keep coming, instead of starting a
// goroutine per batch.

// The group commit's bounds, shared by every kind.
const (
	// MaxBatch is the most requests (for AllowAll groups, keys) one call carries.
	MaxBatch = 128
	// maxBatchBytes bounds a call's keys and arguments, so that one call never holds the
	// server for long.
	maxBatchBytes = 32 << 10
	// maxInFlight is how many calls to one destination may be in flight at once. One makes
	// the largest batches; measured, two made them smaller and cost more per decision.
	maxInFlight = 1
	// maxGather bounds the yields before a batch is taken (gather).
	maxGather = 8
)

// Kind is one kind of request, as the group commit sees it: its scripts, its wire functions
// (the engine's wire.go and wire_kinds.go), and how its calls are routed and counted.
type Kind[Req, Rep any] struct {
	// Single is the script of a call of one request; Batch that of several, nil for a kind
	// whose requests each go in a call of their own, never queued. They may be the same script
	// (AllowAll's groups): a lone request then goes to its node, as a batch does.
	Single, Batch *loader.Script
	// Acked says its requests may record, and so a request that recorded waits for the
	// acknowledgements the transport asks for (Ack); a settle or a release gives back, and
	// waits for none.
	Acked bool
	// Routed sends its batches to the primary that serves their keys' slots, on its own
	// connection (decisions, AllowAll groups). Without it, batches keep to their slot, through
	// the engine's client (peeks: it is the client that sends read-only scripts to replicas
	// when asked to, which a batch sent to a primary's connection would ignore).
	Routed bool
	// Encode lays out a call of reqs in keys and args: the batch script's when it carries
	// several.
	Encode func(reqs []Req, keys, args []string) ([]string, []string)
	// Decode reads a call's reply into outs, one per request of reqs, in order: each one's
	// Reply, Recorded, Invalid, and Err when the server answered that request alone with an
	// error. It is called with outs zeroed, also when the whole reply is an error (which the
	// transport then hands each request).
	Decode func(reply valkey.ValkeyResult, reqs []Req, outs []Outcome[Rep])
	// Size is the size rule: what a request adds to a call, in requests (or keys) against
	// MaxBatch, and in bytes against maxBatchBytes. Only a kind with a Batch script needs it.
	Size func(req *Req) (count, bytes int)
	// Called, when set, counts a call of n of the kind's requests (a batch, or one sent alone
	// while batching is on), for the batch-size metric.
	Called func(ctx context.Context, n int)
}

// Outcome is what came back for one request.
type Outcome[Rep any] struct {
	// Reply is what the server answered for the request, as the kind's Decode read it; its
	// zero value when the call failed.
	Reply Rep
	// Recorded says the request recorded something the acknowledgements must hold (an
	// admission, a lease granted).
	Recorded bool
	// Err is the call's failure (the server's error reply for the whole call, a connection
	// that failed, the caller's context that ended first), or the server's error reply for this
	// request alone.
	Err error
	// Invalid says the reply is none the kind's script gives.
	Invalid error
	// Ack, for a request that recorded, says the acknowledgements asked for did not hold it: it
	// is recorded on the primary, but not where it was asked to be (an error wrapping
	// ErrUnavailable), or a WAIT or WAITAOF failed.
	Ack error
}

// Failure is o's error for what was asked (what names it): Err classified as the engine's
// errors are (callerr.Classify), Invalid or Ack, wrapped with what; nil when o holds a reply
// that holds.
func (o *Outcome[Rep]) Failure(ctx context.Context, what func() string) error {
	switch {
	case o.Err != nil:
		return callerr.Classify(ctx, what(), o.Err)
	case o.Invalid != nil:
		return fmt.Errorf("%s: %w", what(), o.Invalid)
	case o.Ack != nil:
		return fmt.Errorf("%s: %w", what(), o.Ack)
	}
	return nil
}

// failed is the Outcome of a request whose call ended with err before it came back.
func failed[Rep any](err error) Outcome[Rep] { return Outcome[Rep]{Err: err} }

// Commit is the group commit of one kind of request. Make one with NewCommit.
type Commit[Req, Rep any] struct {
	t     *Transport
	kind  Kind[Req, Rep]
	acked bool // its recorded requests wait for acknowledgements
	// exec runs one call (exec.go); the tests' fakes stand in for it.
	exec func(ctx context.Context, node valkey.Client, reqs []Req, outs []Outcome[Rep], built *scratch) (got ackReplies, callErr error)

	// retried counts the requests sent again on their own after their call (or their part of
	// it) did not take them.
	retried atomic.Int64

	calls   sync.Pool
	batches sync.Pool

	mu     sync.Mutex
	queues map[Dest]*queue[Req, Rep]
}

// call is one request in the group commit's hands: what it carries, where it goes, its
// caller's context, and what came back. Calls are pooled: a call goes back once its outcome is
// copied out, or once it is taken out of its queue unsent; a call whose caller gave up on it
// after it was taken into a batch is left to the collector, since the batch still writes to
// it.
type call[Req, Rep any] struct {
	ctx  context.Context
	req  [1]Req          // one, so that a call sent alone is a batch of one without allocating
	out  [1]Outcome[Rep] // its outcome, as exec left it
	ack  ackReplies      // what the acknowledgements behind its call answered
	dest Dest
	sent bool // taken into a batch; under Commit.mu
	done chan struct{}
	// built is what a call sent alone is laid out in.
	built scratch
}

// scratch is what a call's keys and arguments are laid out in, kept from one use to the next.
type scratch struct {
	keys, args []string
}

// queue is one destination's calls in flight and requests waiting.
type queue[Req, Rep any] struct {
	inFlight int
	waiting  []*call[Req, Rep]
}

// batch is a call of several requests, with what it is built in: pooled, so that the slices
// of one batch serve the next.
type batch[Req, Rep any] struct {
	calls []*call[Req, Rep]
	reqs  []Req
	outs  []Outcome[Rep]
	retry []*call[Req, Rep]
	built scratch
}

// NewCommit makes the group commit of k on t.
func NewCommit[Req, Rep any](t *Transport, k Kind[Req, Rep]) *Commit[Req, Rep] {
	c := &Commit[Req, Rep]{t: t, kind: k, acked: k.Acked && t.ack.On(), queues: map[Dest]*queue[Req, Rep]{}}
	c.exec = c.execScript
	c.calls.New = func() any { return &call[Req, Rep]{done: make(chan struct{}, 1)} }
	c.batches.New = func() any { return new(batch[Req, Rep]) }
	return c
}

// Scripts are the kind's scripts, for a preload.
func (c *Commit[Req, Rep]) Scripts() []*loader.Script {
	s := []*loader.Script{c.kind.Single}
	if b := c.kind.Batch; b != nil && b != c.kind.Single {
		s = append(s, b)
	}
	return s
}

// Retried is how many requests went again alone after their call did not take them.
func (c *Commit[Req, Rep]) Retried() int64 { return c.retried.Load() }

// Route is the destination of a request on key: in a cluster, for a routed kind, the primary
// that serves key's slot by the slot map, else the slot; on a standalone server, and for a
// kind that never batches, the engine's client. each says the request takes its own clock.
// A request over several keys (an AllowAll group) goes where every one of its keys routes.
func (c *Commit[Req, Rep]) Route(key string, each bool) Dest {
	d := Dest{each: each}
	if c.t.slots == nil || c.kind.Batch == nil {
		return d
	}
	slot := slotOf(key)
	if c.kind.Routed {
		if addr, ok := c.t.slots.primary(slot); ok {
			d.node = addr
			return d
		}
	}
	d.slot = slot
	return d
}

// BySlot is the destination of key's slot through the engine's client, which follows MOVED
// and ASK: where a request over several keys that its node did not take (ErrNotTaken) goes
// again, one slot at a time.
func (c *Commit[Req, Rep]) BySlot(key string) Dest {
	if c.t.slots == nil {
		return Dest{}
	}
	return Dest{slot: slotOf(key)}
}

// Do sends req to dest and returns its outcome, or, as soon as ctx ends, ctx's error: without
// batching, or for a kind that never batches, in a call of its own; else alone at once when
// dest is idle, or in the next batch. A caller whose context has ended sends nothing; one
// whose context ends while req waits takes it out, and it is never sent; once sent, it may
// still be applied, once.
//
// A call sent alone runs on a goroutine of its own when ctx can end (sendctx.Promptly):
// valkey-go honours a context while a call waits in a connection's queue, but not while the
// connection it needs is dialled and greets the server (HELLO), which on a server that takes
// connections and does not answer (paused, or overloaded) lasts the dial timeout, nor while a
// call waits for another's dial of that connection.
func (c *Commit[Req, Rep]) Do(ctx context.Context, req Req, dest Dest) Outcome[Rep] {
	return c.send(ctx, req, dest, true)
}

// Send is Do for a caller that runs on a goroutine of its own already, which nobody waits on
// past ctx (a call that must outlive its caller's context): a call sent alone is sent on it,
// and it returns when the call comes back, or when ctx ends while req waits in a queue.
func (c *Commit[Req, Rep]) Send(ctx context.Context, req Req, dest Dest) Outcome[Rep] {
	return c.send(ctx, req, dest, false)
}

// send is Do (promptly) and Send.
func (c *Commit[Req, Rep]) send(ctx context.Context, req Req, dest Dest, promptly bool) Outcome[Rep] {
	if err := ctx.Err(); err != nil {
		// The caller has gone already (a gRPC call whose deadline passed before its
		// interceptor ran, say): nothing is sent, so nothing is decided on its behalf.
		return Outcome[Rep]{Err: err}
	}
	var q *queue[Req, Rep]
	if c.t.batching && c.kind.Batch != nil {
		c.mu.Lock()
		q = c.queue(dest)
		if q.inFlight >= maxInFlight || len(q.waiting) > 0 {
			cl := c.get(ctx, req, dest)
			q.waiting = append(q.waiting, cl)
			c.mu.Unlock()
			return c.wait(ctx, q, cl)
		}
		q.inFlight++
		c.mu.Unlock()
	}
	if !promptly || ctx.Done() == nil {
		return c.alone(ctx, req, dest, q)
	}
	o, _ := sendctx.Promptly(ctx, func() Outcome[Rep] { return c.alone(ctx, req, dest, q) }, failed[Rep], nil)
	return o
}

// alone sends req to dest in a call of its own, on this goroutine, and returns its outcome; q,
// when not nil, is the queue that counts it in flight (sentAlone counts it out, however the
// call ends: a call left counted in flight would hold every later request of dest in the
// queue for good).
func (c *Commit[Req, Rep]) alone(ctx context.Context, req Req, dest Dest, q *queue[Req, Rep]) Outcome[Rep] {
	if q != nil {
		defer c.sentAlone(context.WithoutCancel(ctx), q)
	}
	cl := c.get(ctx, req, dest)
	c.sendAlone(ctx, cl)
	o := c.outcome(ctx, cl)
	c.put(cl)
	return o
}

// wait waits for cl, queued in q, to come back in a batch, and returns its outcome; or, when
// ctx ends first, takes it out of q if no batch took it yet (it is never sent), and returns
// ctx's error.
func (c *Commit[Req, Rep]) wait(ctx context.Context, q *queue[Req, Rep], cl *call[Req, Rep]) Outcome[Rep] {
	select {
	case <-cl.done:
		o := c.outcome(ctx, cl)
		c.put(cl)
		return o
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
			c.put(cl)
		}
		return Outcome[Rep]{Err: ctx.Err()}
	}
}

// outcome is cl's outcome as its caller gets it, on the caller's ctx: with the check of its
// acknowledgements, for a request that recorded something.
func (c *Commit[Req, Rep]) outcome(ctx context.Context, cl *call[Req, Rep]) Outcome[Rep] {
	o := cl.out[0]
	if c.acked && o.Recorded && o.Err == nil && o.Invalid == nil {
		o.Ack = c.t.ack.check(ctx, cl.ack)
	}
	return o
}

// get is a call from the pool, carrying req to dest for a caller on ctx.
func (c *Commit[Req, Rep]) get(ctx context.Context, req Req, dest Dest) *call[Req, Rep] {
	cl := c.calls.Get().(*call[Req, Rep])
	cl.ctx, cl.req[0], cl.dest = ctx, req, dest
	return cl
}

// put puts cl back in the pool: nothing may hold it any more.
func (c *Commit[Req, Rep]) put(cl *call[Req, Rep]) {
	var zero Req
	cl.ctx, cl.req[0], cl.out[0], cl.dest, cl.ack, cl.sent = nil, zero, Outcome[Rep]{}, Dest{}, ackReplies{}, false
	c.calls.Put(cl)
}

// queue returns the queue of dest. Under c.mu.
func (c *Commit[Req, Rep]) queue(dest Dest) *queue[Req, Rep] {
	q := c.queues[dest]
	if q == nil {
		q = &queue[Req, Rep]{}
		c.queues[dest] = q
	}
	return q
}

// take moves the next batch from q's waiting requests into b.calls, by the size rule, and
// counts it in flight; false when none waits. Under c.mu.
func (c *Commit[Req, Rep]) take(q *queue[Req, Rep], b *batch[Req, Rep]) bool {
	if len(q.waiting) == 0 {
		return false
	}
	n, count, bytes := 0, 0, 0
	for n < len(q.waiting) {
		k, size := c.kind.Size(&q.waiting[n].req[0])
		count, bytes = count+k, bytes+size
		if n > 0 && (count > MaxBatch || bytes > maxBatchBytes) {
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
func (c *Commit[Req, Rep]) sentAlone(ctx context.Context, q *queue[Req, Rep]) {
	c.called(ctx, 1)
	c.mu.Lock()
	q.inFlight--
	var next *batch[Req, Rep]
	if len(q.waiting) > 0 {
		next = c.batches.Get().(*batch[Req, Rep])
		c.take(q, next)
	}
	c.mu.Unlock()
	if next != nil {
		go c.sendTaken(q, next)
	}
}

// called counts a call of n requests (Kind.Called).
func (c *Commit[Req, Rep]) called(ctx context.Context, n int) {
	if c.kind.Called != nil {
		c.kind.Called(ctx, n)
	}
}

// sendTaken sends b, a batch taken from q, and then each next batch q holds when the one
// before comes back, until none waits: one goroutine for as long as batches follow each
// other, not one per batch.
func (c *Commit[Req, Rep]) sendTaken(q *queue[Req, Rep], b *batch[Req, Rep]) {
	defer func() {
		clear(b.calls)
		b.calls = b.calls[:0]
		c.batches.Put(b)
	}()
	for {
		c.sendBatch(b)
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
// yield. It makes batches larger under load, as go run ./bench -scenario cluster measures.
func (c *Commit[Req, Rep]) gather(q *queue[Req, Rep]) {
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

// sendBatch runs b's calls, taken from their queue, as one call to the server, under a
// context that lasts as long as its most patient caller's (none of them may cut the call
// short for the others); sends each request the call did not take (the retry rule) again
// alone; hands each caller its outcome; and counts the calls made. It runs on a committer's
// goroutine, where a panic would end the process and leave the callers waiting: one is handed
// to every caller of the batch as its error instead.
func (c *Commit[Req, Rep]) sendBatch(b *batch[Req, Rep]) {
	ctx, cancel := batchContext(b.calls)
	defer func() {
		if p := recover(); p != nil {
			err := fmt.Errorf("strictrate: the batch call failed: panic: %v", p)
			for _, cl := range b.calls {
				cl.out[0] = Outcome[Rep]{Err: err}
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
		c.called(context.Background(), 1)
		return
	}
	node, gone := c.nodeFor(b.calls[0].dest, len(b.calls))
	var callErr error
	if gone {
		// The engine's client no longer knows the node (it left the cluster, say): nothing
		// was sent.
		callErr = errNodeGone
	} else {
		n := len(b.calls)
		b.reqs, b.outs = b.reqs[:0], slices.Grow(b.outs[:0], n)[:n]
		for _, cl := range b.calls {
			b.reqs = append(b.reqs, cl.req[0])
		}
		clear(b.outs)
		var got ackReplies
		got, callErr = c.exec(ctx, node, b.reqs, b.outs, &b.built)
		for i, cl := range b.calls {
			cl.out[0], cl.ack = b.outs[i], got
		}
		clear(b.reqs)
		clear(b.outs)
	}
	retry := b.retry[:0]
	for _, cl := range b.calls {
		if gone || c.notTaken(callErr, &cl.out[0], true) {
			retry = append(retry, cl)
		}
	}
	b.retry = retry
	if taken := len(b.calls) - len(retry); taken > 0 {
		c.called(context.Background(), taken)
	}
	if len(retry) > 0 {
		if c.t.slots != nil {
			c.t.slots.reload() // a slot moved, or its node is gone
		}
		c.retryAlone(ctx, retry)
	}
	clear(b.retry)
}

// sendAlone sends cl as a call of the kind's single script: through the engine's client, the
// keys declared, or, for a kind whose one script takes any number of requests and reads its
// keys undeclared (AllowAll's groups, whose keys may be of several slots of a primary), to
// its destination's node; and, when that node did not take it (the retry rule), once more
// through the engine's client.
func (c *Commit[Req, Rep]) sendAlone(ctx context.Context, cl *call[Req, Rep]) {
	cl.out[0], cl.ack = Outcome[Rep]{}, ackReplies{}
	node, gone := c.nodeFor(cl.dest, 1)
	if !gone {
		got, callErr := c.exec(ctx, node, cl.req[:], cl.out[:], &cl.built)
		cl.ack = got
		// Through the engine's client, a call is the client's to redirect, and taken or
		// failed as it came back.
		if node == nil || !c.notTaken(callErr, &cl.out[0], false) {
			return
		}
	}
	c.t.slots.reload()
	c.retryAlone(ctx, []*call[Req, Rep]{cl})
}

// nodeFor returns the client of dest's node for a call of n requests: a batch for a primary,
// or a lone request of a kind whose one script takes any number (it reads its keys
// undeclared); nil for the engine's client, which routes by the keys, declared. gone reports
// a node the engine's client no longer knows.
func (c *Commit[Req, Rep]) nodeFor(dest Dest, n int) (node valkey.Client, gone bool) {
	if dest.node == "" || n == 1 && c.kind.Single != c.kind.Batch {
		return nil, false
	}
	node = c.t.slots.nodeClient(dest.node)
	return node, node == nil
}

// batchContext is the context of a call of calls: it ends at the latest deadline of theirs,
// and not at all when one of them has none.
func batchContext[Req, Rep any](calls []*call[Req, Rep]) (context.Context, context.CancelFunc) {
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
