package transport

import (
	"context"

	"github.com/valkey-io/valkey-go"

	"github.com/strictrate/strictrate/internal/sendctx"
	"github.com/strictrate/strictrate/loader"
)

// execScript is the one function that calls a script: it runs reqs (one request, or several
// of c's kind bound for one destination) as one call of the kind's script, laid out by the
// kind's Encode in built's slices, through node (a cluster primary's client, the keys
// undeclared) or, when node is nil, the engine's client (the keys declared), on ctx without
// its deadline (loader.Script.Exec), with the acknowledgements asked for: WAIT in the same
// round trip, and with WithDurableAck, on a connection held for the call, WAITAOF right after
// the reply when the call recorded something. The kind's Decode reads the reply into outs;
// each request gets the call's error, if its whole reply was one. It returns what the
// acknowledgements answered, and that error.
func (c *Commit[Req, Rep]) execScript(ctx context.Context, node valkey.Client, reqs []Req, outs []Outcome[Rep], built *scratch) (ackReplies, error) {
	s := c.kind.Single
	if len(reqs) > 1 {
		s = c.kind.Batch
	}
	keys, args := c.kind.Encode(reqs, built.keys[:0], built.args[:0])
	defer func() {
		clear(keys)
		clear(args)
		built.keys, built.args = keys, args
	}()
	var client valkey.Client = c.t.client
	switch {
	case node != nil:
		client = node
	case c.t.slots != nil && len(reqs) == 1 && !oneSlot(keys):
		// Keys of several slots cannot go through the cluster client, declared (valkey-go's
		// builder refuses them); a request over several keys goes through it only when its
		// node did not take it (the retry rule), and so nothing is sent.
		for i := range outs {
			outs[i] = Outcome[Rep]{Err: ErrNotTaken}
		}
		return ackReplies{}, ErrNotTaken
	}
	lc := loader.Call{Keys: keys, Args: args, Undeclared: node != nil}
	var reply valkey.ValkeyResult
	var got ackReplies
	ack := c.t.ack
	switch {
	case !c.acked:
		reply, _ = s.Exec(ctx, client, lc)
		c.kind.Decode(reply, reqs, outs)
	case !ack.waitAOF():
		lc.Then = ack.inline
		var after []valkey.ValkeyResult
		reply, after = s.Exec(ctx, client, lc)
		got = ack.readInline(after)
		c.kind.Decode(reply, reqs, outs)
	default:
		// WAITAOF waits for the writes of the connection it is sent on: the call's own, so
		// both go on one connection held for the call.
		lc.Then = ack.inline
		_ = client.Dedicated(func(dc valkey.DedicatedClient) error {
			var after []valkey.ValkeyResult
			reply, after = s.Exec(ctx, dc, lc)
			got = ack.readInline(after)
			c.kind.Decode(reply, reqs, outs)
			if recorded(outs) && reply.Error() == nil {
				got = ack.readAfter(got, dc.Do(sendctx.Of(ctx), ack.afterAdmission(dc.B())))
			}
			return nil
		})
	}
	callErr := reply.Error()
	if callErr != nil {
		for i := range outs {
			outs[i].Err = callErr
		}
	}
	return got, callErr
}

// recorded reports whether any of outs recorded something.
func recorded[Rep any](outs []Outcome[Rep]) bool {
	for i := range outs {
		if outs[i].Recorded {
			return true
		}
	}
	return false
}

// oneSlot reports whether keys are all of one cluster slot.
func oneSlot(keys []string) bool {
	for _, k := range keys[min(1, len(keys)):] {
		if slotOf(k) != slotOf(keys[0]) {
			return false
		}
	}
	return true
}
