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

// call is a request in a committer's hands.
type call struct {
	ctx   context.Context
	req   request
	out   outcome
	sent  bool          // taken into a batch; under committer.mu
	done  chan struct{} // closed when out is set; for a call that waits in a queue
	alone [1]*call      // the call itself, when sent alone (sendOne)
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
	if !c.e.batching {
		cl := call{ctx: ctx, req: req}
		c.sendOne(ctx, &cl)
		return cl.out
	}
	c.mu.Lock()
	q := c.queue(&req)
	if q.inFlight < maxInFlight && len(q.waiting) == 0 {
		q.inFlight++
		c.mu.Unlock()
		// Counted out however the call ends, a panic included: a call left counted in flight
		// would hold every later decision of this destination in the queue for good.
		defer c.sent(ctx, q, 1)
		cl := call{ctx: ctx, req: req, sent: true}
		c.sendOne(ctx, &cl)
		return cl.out
	}
	cl := &call{ctx: ctx, req: req, done: make(chan struct{})}
	q.waiting = append(q.waiting, cl)
	c.mu.Unlock()
	select {
	case <-cl.done:
		return cl.out
	case <-ctx.Done():
		c.mu.Lock()
		if !cl.sent {
			for i, w := range q.waiting {
				if w == cl {
					q.waiting = append(q.waiting[:i], q.waiting[i+1:]...)
					break
				}
			}
		}
		c.mu.Unlock()
		return outcome{err: ctx.Err()}
	}
}

// take removes the next batch from q's waiting requests and counts it in flight; nil when
// none waits. Under c.mu.
func (c *committer) take(q *queue) []*call {
	if len(q.waiting) == 0 {
		return nil
	}
	n, size := 0, 0
	for n < len(q.waiting) && n < maxBatch {
		size += q.waiting[n].req.size()
		if n > 0 && size > maxBatchBytes {
			break
		}
		n++
	}
	batch := make([]*call, n)
	copy(batch, q.waiting)
	q.waiting = append(q.waiting[:0], q.waiting[n:]...)
	for _, cl := range batch {
		cl.sent = true
	}
	q.inFlight++
	return batch
}

// send runs calls as one call to the server, hands each its outcome, and sends what waits. It
// runs on a goroutine of the committer's, where a panic would end the process and leave the
// callers waiting: one is handed to every caller of the batch as its error instead, and the
// call is counted out all the same.
func (c *committer) send(ctx context.Context, q *queue, calls []*call) {
	defer func() {
		if p := recover(); p != nil {
			err := fmt.Errorf("strictrate: the batch call failed: panic: %v", p)
			for _, cl := range calls {
				cl.out = outcome{err: err}
			}
		}
		for _, cl := range calls {
			close(cl.done)
		}
		c.sent(ctx, q, len(calls))
	}()
	if len(calls) == 1 {
		c.sendOne(ctx, calls[0])
	} else {
		c.sendBatch(ctx, calls)
	}
}

// sent counts a call of n requests that came back, and sends the next batch, if one waits.
func (c *committer) sent(ctx context.Context, q *queue, n int) {
	op := opAllow
	if c.single.ReadOnly() {
		op = opPeek
	}
	c.e.metrics.batchSize.Record(ctx, int64(n), c.e.metrics.byOp[op]...)
	c.mu.Lock()
	q.inFlight--
	next := c.take(q)
	c.mu.Unlock()
	if next != nil {
		go c.sendTaken(q, next)
	}
}

// sendTaken sends a batch taken from the queue, under a context that lasts as long as its
// most patient caller's: none of them may cut the call short for the others.
func (c *committer) sendTaken(q *queue, calls []*call) {
	ctx, cancel := context.Background(), context.CancelFunc(func() {})
	var latest time.Time
	for _, cl := range calls {
		deadline, ok := cl.ctx.Deadline()
		if !ok {
			latest = time.Time{}
			break
		}
		if deadline.After(latest) {
			latest = deadline
		}
	}
	if !latest.IsZero() {
		ctx, cancel = context.WithDeadline(ctx, latest)
	}
	defer cancel()
	c.send(ctx, q, calls)
}

// sendOne sends one request as a call of the single script.
func (c *committer) sendOne(ctx context.Context, cl *call) {
	cl.alone[0] = cl // a batch of one, without allocating its slice
	c.exec(ctx, c.single, []string{cl.req.key}, cl.req.singleArgs(), cl.alone[:])
}

// exec runs s with keys and args and the acknowledgements asked for (execAcked: one WAIT per
// call, and one WAITAOF per call that admitted something, whatever the decisions it carries),
// and reads the reply into the outcomes of calls, the requests it carries in KEYS order.
func (c *committer) exec(ctx context.Context, s *loader.Script, keys, args []string, calls []*call) {
	ack := c.e.execAcked(ctx, s, c.ack, keys, args, func(reply valkey.ValkeyResult) bool {
		readDecisions(reply, calls)
		return slices.ContainsFunc(calls, func(cl *call) bool { return cl.out.admits() })
	})
	for _, cl := range calls {
		cl.out.ack = ack
	}
}

// sendBatch sends several requests as one call of the batch script.
func (c *committer) sendBatch(ctx context.Context, calls []*call) {
	// The limit sets of the batch, each once; requests name theirs by its position.
	var sets []*limitSet
	setOf := make([]int, len(calls))
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
	keys := make([]string, len(calls))
	args := make([]string, 0, 2+5*len(sets)+3*len(calls))
	args = append(args, clock, strconv.Itoa(len(sets)))
	for _, s := range sets {
		args = append(args, strconv.Itoa(len(s.limits)))
		args = append(args, s.nums...)
	}
	for i, cl := range calls {
		keys[i] = cl.req.key
		args = append(args, cl.req.cost, strconv.Itoa(setOf[i]+1))
		if clock != "" {
			args = append(args, cl.req.now)
		}
	}
	c.exec(ctx, c.batch, keys, args, calls)
}
