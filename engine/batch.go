package engine

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/valkey-io/valkey-go"

	"github.com/strictrate/strictrate/loader"
)

// Group commit (WithBatching): a decision goes to the server at once when nothing waits for
// its destination; while earlier calls are in flight, decisions queue, and the next call
// carries all of them (up to maxBatch, maxBatchBytes) in one EVALSHA of the batch script. The
// script's fixed cost, its start and the server's clock, is then paid once per call, not per
// decision. A destination is the server, or in a cluster a hash slot: every key of one call
// is in one slot, so the client routes the call, and follows MOVED and ASK, as it does for a
// single decision.
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
	calls []*call
	keys  []string
	args  []string
	sets  []*limitSet
	setOf []int
}

var batchPool = sync.Pool{New: func() any { return new(batch) }}

func getBatch() *batch { return batchPool.Get().(*batch) }

// put clears b, so that the pool holds on to no call or key, and puts it back.
func (b *batch) put() {
	clear(b.calls)
	b.calls = b.calls[:0]
	batchPool.Put(b)
}

// readReply reads a reply to b into its calls' outcomes; it reports whether any admits.
func (b *batch) readReply(reply valkey.ValkeyResult) bool {
	readDecisions(reply, b.calls)
	return slices.ContainsFunc(b.calls, func(cl *call) bool { return cl.out.admits() })
}

// committer batches the requests bound for one script's destinations.
type committer struct {
	e       *Engine
	single  *loader.Script // a call of one request
	batch   *loader.Script // a call of several
	ack     bool           // send each writing call with WAIT and/or WAITAOF (after an admission)
	cluster bool

	mu     sync.Mutex
	queues map[uint16]*queue // by slot in a cluster; one, at slot 0, otherwise
}

// queue is one destination's calls in flight and requests waiting.
type queue struct {
	inFlight int
	waiting  []*call
}

func newCommitter(e *Engine, single, batch *loader.Script) *committer {
	return &committer{e: e, single: single, batch: batch, ack: e.ackPolicy.on() && !single.ReadOnly(),
		cluster: e.client.Mode() == valkey.ClientModeCluster, queues: map[uint16]*queue{}}
}

// queue returns the queue of req's destination: its slot in a cluster, and whose clock it
// takes (a batch reads the server's clock once for all its requests, or takes each one's).
func (c *committer) queue(req *request) *queue {
	var dest uint16
	if c.cluster {
		cmd := valkey.Completed{}.SetSlot(req.key)
		dest = cmd.Slot() // below 1 << 14
	}
	if req.now != "" {
		dest |= 1 << 14
	}
	q := c.queues[dest]
	if q == nil {
		q = &queue{}
		c.queues[dest] = q
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
		c.sendCalls(b)
		c.recordBatch(context.Background(), len(b.calls))
		c.mu.Lock()
		q.inFlight--
		more := c.take(q, b)
		c.mu.Unlock()
		if !more {
			return
		}
	}
}

// sendCalls runs b's calls as one call to the server, under a context that lasts as long as
// its most patient caller's (none of them may cut the call short for the others), and hands
// each caller its outcome. It runs on a goroutine of the committer's, where a panic would end
// the process and leave the callers waiting: one is handed to every caller of the batch as
// its error instead.
func (c *committer) sendCalls(b *batch) {
	ctx, cancel := batchContext(b.calls)
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
	} else {
		c.send(ctx, b)
	}
}

// batchContext is the context of a call of calls: it ends at the latest deadline of theirs,
// and not at all when one of them has none.
func batchContext(calls []*call) (context.Context, context.CancelFunc) {
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

// send sends b's requests, several, as one call of the batch script.
func (c *committer) send(ctx context.Context, b *batch) {
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
		args = append(args, itoa(len(s.limits)))
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
	c.exec(ctx, c.batch, keys, args, calls, b)
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
