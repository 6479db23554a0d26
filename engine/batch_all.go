package engine

import (
	"context"
	"fmt"
	"slices"
	"sync"
)

// allCommitter is the group commit of AllowAll (WithBatching), as the committer is of single
// decisions: a group (the requests of one AllowAll that one node holds) goes to the server at
// once when nothing is in flight to its node; while a call is, groups queue, and the next call
// carries all of them (up to maxBatch keys) in one call of decide_all.lua, which decides them
// one after the other, each all or nothing. The script's start, the server's clock and the
// functions of the general path are then paid once per call, not per group: a request of
// several descriptors costs the server little more than its keys' own commands.
//
// A group bound for no known primary in a cluster (its keys declared, routed by the client)
// is sent alone, since keys of several slots cannot be declared in one call. What a batched
// call's failure means is what it means for a group sent alone: each group reads the call's
// error, or its own requests' errors, and AllowAll goes on as it does after a call of its own
// (a call refused before it ran goes again per slot; anything else is the caller's error).
type allCommitter struct {
	e *Engine

	mu     sync.Mutex
	queues map[string]*allQueue // by node: a primary's address, "" for a standalone server
}

// allQueue is one node's groups: whether a call is in flight, and those waiting for the next.
type allQueue struct {
	node     string
	inFlight bool
	waiting  []*allCall
}

func newAllCommitter(e *Engine) *allCommitter {
	return &allCommitter{e: e, queues: map[string]*allQueue{}}
}

// do sends c (decides, or with check peeks only) and returns once its outcomes are in c: alone
// at once when its node is idle or batching is off, else in the next call to its node. It
// returns the caller's ctx.Err() when ctx ends first: then c was never sent, or it was and its
// outcomes are lost to the caller (its call may still record).
func (ac *allCommitter) do(ctx context.Context, c *allCall, check bool) error {
	c.check = check
	if !ac.e.batching || ac.e.decides.slots != nil && c.node == "" {
		ac.e.sendGroups(ctx, c.node, allGroups{c})
		return nil
	}
	ac.mu.Lock()
	q := ac.queues[c.node]
	if q == nil {
		q = &allQueue{node: c.node}
		ac.queues[c.node] = q
	}
	if !q.inFlight {
		q.inFlight = true
		ac.mu.Unlock()
		// Handed on however the call ends, a panic included: a queue left in flight would hold
		// every later group of its node for good.
		defer ac.handOn(q)
		ac.e.sendGroups(ctx, c.node, allGroups{c})
		ac.e.metrics.batchSize.Record(context.Background(), 1, ac.e.metrics.byOp[opPolicy]...)
		return nil
	}
	c.ctx, c.sent, c.done = ctx, false, make(chan struct{}, 1)
	q.waiting = append(q.waiting, c)
	ac.mu.Unlock()
	select {
	case <-c.done:
		return nil
	case <-ctx.Done():
		ac.mu.Lock()
		if !c.sent {
			if i := slices.Index(q.waiting, c); i >= 0 {
				q.waiting = slices.Delete(q.waiting, i, i+1)
			}
		}
		ac.mu.Unlock()
		return ctx.Err()
	}
}

// handOn ends q's call in flight: the groups waiting, if any, go in the next call, sent by a
// goroutine of the committer's (sendTaken); else q is idle.
func (ac *allCommitter) handOn(q *allQueue) {
	ac.mu.Lock()
	next := ac.take(q)
	if next == nil {
		q.inFlight = false
	}
	ac.mu.Unlock()
	if next != nil {
		go ac.sendTaken(q, next)
	}
}

// take moves the next call's groups out of q's waiting ones: as many as fit in maxBatch keys,
// and at least one; nil when none waits. Under ac.mu.
func (ac *allCommitter) take(q *allQueue) allGroups {
	if len(q.waiting) == 0 {
		return nil
	}
	n, keys := 0, 0
	for n < len(q.waiting) {
		keys += len(q.waiting[n].parts)
		if n > 0 && keys > maxBatch {
			break
		}
		n++
	}
	groups := slices.Clone(q.waiting[:n])
	rest := copy(q.waiting, q.waiting[n:])
	clear(q.waiting[rest:])
	q.waiting = q.waiting[:rest]
	for _, c := range groups {
		c.sent = true
	}
	return groups
}

// sendTaken sends groups, taken from q, then each next call's groups q holds when the one
// before comes back, until none waits. It runs on a goroutine of the committer's, where a
// panic would end the process and leave the callers waiting: one is handed to every group of
// the call as its error instead.
func (ac *allCommitter) sendTaken(q *allQueue, groups allGroups) {
	for groups != nil {
		ac.send(q, groups)
		ac.mu.Lock()
		groups = ac.take(q)
		if groups == nil {
			q.inFlight = false
		}
		ac.mu.Unlock()
	}
}

// send runs one call of groups under a context that lasts as long as its most patient
// caller's, and signals each group's caller.
func (ac *allCommitter) send(q *allQueue, groups allGroups) {
	ctx, cancel := batchContext(groups, func(c *allCall) context.Context { return c.ctx })
	defer func() {
		if p := recover(); p != nil {
			err := fmt.Errorf("strictrate: the allow_all call failed: panic: %v", p)
			for _, c := range groups {
				c.callErr = err
			}
		}
		cancel()
		// Once signalled, a group is its caller's again: nothing here reads it after.
		for _, c := range groups {
			c.done <- struct{}{}
		}
	}()
	ac.e.sendGroups(ctx, q.node, groups)
	ac.e.metrics.batchSize.Record(context.Background(), int64(len(groups)), ac.e.metrics.byOp[opPolicy]...)
}
