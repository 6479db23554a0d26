package transport

import (
	"context"
	"fmt"
	"time"

	"github.com/valkey-io/valkey-go"

	"github.com/strictrate/strictrate/internal/callerr"
)

// Ack is what a recorded request waits for before its caller sees it recorded: replicas that
// hold it (the engine's WithReplicaAck: WAIT) and copies of it fsynced to an append-only file
// (WithDurableAck: WAITAOF). Both wait for the writes of the connection they are sent on, so
// both go on the connection of the call that recorded, and one of each serves every request of
// a batch. WAIT goes in the same round trip as the call, whatever it records (one per call);
// WAITAOF goes right after the reply, on the same connection, and only when the call recorded
// something: a call that only denied sends none and never waits for a disk. The zero Ack waits
// for nothing.
type Ack struct {
	Replicas    int           // WAIT numreplicas; below 1, no WAIT
	Timeout     time.Duration // WAIT's timeout, rounded up to whole milliseconds; 0 waits until the context ends
	AOFLocal    int           // WAITAOF numlocal, 0 or 1
	AOFReplicas int           // WAITAOF numreplicas
	AOFTimeout  time.Duration // WAITAOF's timeout, as Timeout
}

// wait reports whether a WAIT is asked for.
func (a Ack) wait() bool { return a.Replicas > 0 }

// waitAOF reports whether a WAITAOF is asked for.
func (a Ack) waitAOF() bool { return a.AOFLocal > 0 || a.AOFReplicas > 0 }

// On reports whether a asks for any acknowledgement.
func (a Ack) On() bool { return a.wait() || a.waitAOF() }

// inline is the WAIT asked for, if any: what goes behind the call in its round trip.
func (a Ack) inline(b valkey.Builder) []valkey.Completed {
	if !a.wait() {
		return nil
	}
	return []valkey.Completed{b.Wait().Numreplicas(int64(a.Replicas)).Timeout(ceilMillis(a.Timeout)).Build()}
}

// afterAdmission is the WAITAOF sent once a call's reply shows it recorded something.
func (a Ack) afterAdmission(b valkey.Builder) valkey.Completed {
	return b.Waitaof().Numlocal(int64(a.AOFLocal)).Numreplicas(int64(a.AOFReplicas)).Timeout(ceilMillis(a.AOFTimeout)).Build()
}

// ceilMillis is d in whole milliseconds, rounded up: the timeouts of WAIT and WAITAOF.
func ceilMillis(d time.Duration) int64 {
	n := int64(d / time.Millisecond)
	if d%time.Millisecond != 0 {
		n++
	}
	return n
}

// ackReplies is what the commands behind one call answered.
type ackReplies struct {
	replicas    int64  // WAIT: replicas that hold the call's writes
	aofSent     bool   // WAITAOF was sent: the call recorded something
	aofLocal    int64  // WAITAOF: 1 when the server's own append-only file has them fsynced
	aofReplicas int64  // WAITAOF: replicas whose append-only files have them fsynced
	err         error  // the command named by failed could not answer
	failed      string // "WAIT" or "WAITAOF"
}

// readInline reads the replies of the commands inline appended, in their order.
func (a Ack) readInline(replies []valkey.ValkeyResult) ackReplies {
	var got ackReplies
	if a.wait() {
		if got.replicas, got.err = replies[0].AsInt64(); got.err != nil {
			got.failed = "WAIT"
		}
	}
	return got
}

// readAfter adds the reply of the WAITAOF sent after the call to got.
func (a Ack) readAfter(got ackReplies, reply valkey.ValkeyResult) ackReplies {
	got.aofSent = true
	counts, err := reply.AsIntSlice()
	if err == nil && len(counts) != 2 {
		err = fmt.Errorf("reply has %d values, want 2", len(counts))
	}
	if err != nil {
		if got.err == nil {
			got.err, got.failed = err, "WAITAOF"
		}
		return got
	}
	got.aofLocal, got.aofReplicas = counts[0], counts[1]
	return got
}

// check returns nil when got is all a asked for, else why not: an error wrapping
// ErrUnavailable (the request was recorded, but is not held where it was asked to be), or the
// server's.
func (a Ack) check(ctx context.Context, got ackReplies) error {
	if got.err != nil {
		return callerr.Classify(ctx, got.failed, got.err)
	}
	if got.replicas < int64(a.Replicas) {
		return fmt.Errorf("%w: admitted on the primary, but %d of %d replicas acknowledged it within %s",
			callerr.ErrUnavailable, got.replicas, a.Replicas, a.Timeout)
	}
	if a.waitAOF() && !got.aofSent {
		return fmt.Errorf("%w: admitted, but no WAITAOF followed its call", callerr.ErrUnavailable)
	}
	if got.aofLocal < int64(a.AOFLocal) || got.aofReplicas < int64(a.AOFReplicas) {
		return fmt.Errorf("%w: admitted, but not fsynced as asked within %s: local append-only file %d of %d, replicas %d of %d",
			callerr.ErrUnavailable, a.AOFTimeout, got.aofLocal, a.AOFLocal, got.aofReplicas, a.AOFReplicas)
	}
	return nil
}
