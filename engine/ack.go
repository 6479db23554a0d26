package engine

import (
	"context"
	"fmt"
	"time"

	"github.com/valkey-io/valkey-go"
)

// ackPolicy is what an admission waits for before its caller sees it admitted: replicas that hold
// it (WithReplicaAck: WAIT) and copies of it fsynced to an append-only file (WithDurableAck:
// WAITAOF). Both wait for the writes of the connection they are sent on, so both go on the
// connection of the call that decided, and one of each serves every decision of a batch. WAIT goes
// in the same round trip as the call, whatever it decides (one per call); WAITAOF goes right after
// the reply, on the same connection, and only when the call admitted something: a call that only
// denied sends none and never waits for a disk.
type ackPolicy struct {
	replicas    int // WAIT numreplicas; below 1, no WAIT
	timeout     time.Duration
	aofLocal    int // WAITAOF numlocal, 0 or 1
	aofReplicas int // WAITAOF numreplicas
	aofTimeout  time.Duration
}

func (a ackPolicy) wait() bool    { return a.replicas > 0 }
func (a ackPolicy) waitAOF() bool { return a.aofLocal > 0 || a.aofReplicas > 0 }
func (a ackPolicy) on() bool      { return a.wait() || a.waitAOF() }

// inline is the WAIT asked for, if any: what goes behind the call in its round trip.
func (a ackPolicy) inline(b valkey.Builder) []valkey.Completed {
	if !a.wait() {
		return nil
	}
	return []valkey.Completed{b.Wait().Numreplicas(int64(a.replicas)).Timeout(ceilUnits(time.Millisecond, a.timeout)).Build()}
}

// afterAdmission is the WAITAOF sent once a call's reply shows an admission.
func (a ackPolicy) afterAdmission(b valkey.Builder) valkey.Completed {
	return b.Waitaof().Numlocal(int64(a.aofLocal)).Numreplicas(int64(a.aofReplicas)).Timeout(ceilUnits(time.Millisecond, a.aofTimeout)).Build()
}

// ackReplies is what the commands behind one call answered.
type ackReplies struct {
	replicas    int64  // WAIT: replicas that hold the call's writes
	aofSent     bool   // WAITAOF was sent: the call admitted something
	aofLocal    int64  // WAITAOF: 1 when the server's own append-only file has them fsynced
	aofReplicas int64  // WAITAOF: replicas whose append-only files have them fsynced
	err         error  // the command named by failed could not answer
	failed      string // "WAIT" or "WAITAOF"
}

// readInline reads the replies of the commands inline appended, in their order.
func (a ackPolicy) readInline(replies []valkey.ValkeyResult) ackReplies {
	var got ackReplies
	if a.wait() {
		if got.replicas, got.err = replies[0].AsInt64(); got.err != nil {
			got.failed = "WAIT"
		}
	}
	return got
}

// readAfter adds the reply of the WAITAOF sent after the call to got.
func (a ackPolicy) readAfter(got ackReplies, reply valkey.ValkeyResult) ackReplies {
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

// check returns nil when got is all a asked for, else why not: an error wrapping ErrUnavailable
// (the admission was recorded, but is not held where it was asked to be), or the server's.
func (a ackPolicy) check(ctx context.Context, got ackReplies) error {
	if got.err != nil {
		return classify(ctx, got.failed, got.err)
	}
	if got.replicas < int64(a.replicas) {
		return fmt.Errorf("%w: admitted on the primary, but %d of %d replicas acknowledged it within %s",
			ErrUnavailable, got.replicas, a.replicas, a.timeout)
	}
	if a.waitAOF() && !got.aofSent {
		return fmt.Errorf("%w: admitted, but no WAITAOF followed its call", ErrUnavailable)
	}
	if got.aofLocal < int64(a.aofLocal) || got.aofReplicas < int64(a.aofReplicas) {
		return fmt.Errorf("%w: admitted, but not fsynced as asked within %s: local append-only file %d of %d, replicas %d of %d",
			ErrUnavailable, a.aofTimeout, got.aofLocal, a.aofLocal, got.aofReplicas, a.aofReplicas)
	}
	return nil
}
