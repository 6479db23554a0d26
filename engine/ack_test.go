package engine_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/valkey-io/valkey-go"

	"github.com/strictrate/strictrate/engine"
	"github.com/strictrate/strictrate/internal/enginetest"
	"github.com/strictrate/strictrate/internal/valkeytest"
	"github.com/strictrate/strictrate/scripts"
)

// With replica acknowledgement, one WAIT follows each call, not each decision: a batch of
// decisions shares it, and every admitted decision is on the replica when its caller hears yes.
func TestBatchedReplicaAckOneWaitPerCall(t *testing.T) {
	primary := valkeytest.New(t, valkeytest.OwnServer())
	rc := replicaOf(t, primary)
	var es []*engine.Engine
	for i := 0; i < 4; i++ {
		es = append(es, enginetest.New(t, primary.Client(t), engine.WithBatching(true), engine.WithReplicaAck(1, time.Second)))
	}
	key, l := oneFollowerPerCall(t, primary.Client(t), es, "wait", engine.PerHour(200))
	enginetest.Want(t, "events on the replica", enginetest.StoredEvents(t, rc, key), int64(l.Max))
}

// oneFollowerPerCall has 64 goroutines take 400 decisions on one key at limit l through es,
// and checks that follower (the command sent with each call: "wait", "waitaof") ran once per
// script call, that the calls were batched, and that min(400, l.Max) were admitted. It returns
// the key and its limit.
func oneFollowerPerCall(t *testing.T, c valkey.Client, es []*engine.Engine, follower string, l engine.Limit) (string, engine.Limit) {
	t.Helper()
	ctx := context.Background()
	key := enginetest.NewKey(t)
	resetStats(t, c)
	results := enginetest.RunConcurrently(t, es, 64, 400, func(e *engine.Engine) (engine.Result, error) {
		return e.Allow(ctx, key, l)
	})
	info, err := valkeytest.ReadInfo(ctx, c, "commandstats")
	if err != nil {
		t.Fatal(err)
	}
	follows, calls := info.CommandStats()[follower].Calls, scriptCalls(t, c)
	t.Logf("400 decisions in %d script calls, %d %s", calls, follows, follower)
	if follows != calls || follows >= 300 {
		t.Fatalf("%d %s for %d script calls and 400 decisions: want one per call, shared", follows, follower, calls)
	}
	admitted := 0
	for _, r := range results {
		if r.Allowed {
			admitted++
		}
	}
	enginetest.Want(t, "admitted", admitted, min(400, l.Max))
	return key, l
}

// WithDurableAck sends one WAITAOF after every admitting call, batches included, and none after
// a call that only denied; the admissions it let through are all in the file after kill -9.
func TestDurableAckOneWaitaofPerCall(t *testing.T) {
	own := valkeytest.New(t, valkeytest.AppendOnly("always"))
	var es []*engine.Engine
	for i := 0; i < 4; i++ {
		es = append(es, enginetest.New(t, own.Client(t), engine.WithBatching(true), engine.WithDurableAck(1, 0, 2*time.Second)))
	}
	c := own.Client(t)
	key, l := oneFollowerPerCall(t, c, es, "waitaof", engine.PerHour(400))
	// The key is full: 64 goroutines' 200 more decisions are denials, batched, and no call of
	// theirs sends a WAITAOF.
	before, calls := waitaofCalls(t, c), scriptCalls(t, c)
	for _, r := range enginetest.RunConcurrently(t, es, 64, 200, func(e *engine.Engine) (engine.Result, error) {
		return e.Allow(context.Background(), key, l)
	}) {
		if r.Allowed {
			t.Fatalf("admitted past a full window: %+v, want a denial", r)
		}
	}
	denyingCalls := scriptCalls(t, c) - calls
	if after := waitaofCalls(t, c); after != before || denyingCalls < 1 {
		t.Fatalf("%d WAITAOFs after %d calls that only denied, want none", after-before, denyingCalls)
	}
	crashAndRestart(t, own, es[0])
	enginetest.Want(t, "events after kill -9 and restart", enginetest.StoredEvents(t, c, key), int64(l.Max))
}

// An admission whose WAITAOF cannot be satisfied in time (a replica that does not exist) is
// refused with ErrUnavailable, though recorded: it can under-admit, never over-admit. A denial
// never waits: no WAITAOF follows it, so it comes back at once, as a denial, even when the
// WAITAOF asked for could never be satisfied.
func TestDurableAckNeverWaitsForADenial(t *testing.T) {
	own := valkeytest.New(t, valkeytest.AppendOnly("always"))
	c := own.Client(t)
	ctx := context.Background()
	l := engine.PerHour(2)

	const timeout = 500 * time.Millisecond
	noReplica := enginetest.New(t, c, engine.WithBatching(false), engine.WithDurableAck(1, 1, timeout))
	key := enginetest.NewKey(t)
	for i := 0; i < l.Max; i++ {
		r, err := noReplica.Allow(ctx, key, l)
		if !errors.Is(err, engine.ErrUnavailable) || r.Allowed || !strings.Contains(err.Error(), "replicas 0 of 1") {
			t.Fatalf("admission whose WAITAOF asks for a missing replica: %+v, %v; want ErrUnavailable saying so", r, err)
		}
	}
	enginetest.Want(t, "events recorded, though refused", enginetest.StoredEvents(t, c, key), int64(l.Max))
	// The denials through an engine that would wait 20 s for the missing replica: one that
	// waited would take the whole timeout, and half of it leaves a busy machine all the time
	// it needs to deny at once.
	const patient = 20 * time.Second
	patientNoReplica := enginetest.New(t, c, engine.WithBatching(false), engine.WithDurableAck(1, 1, patient))
	before := waitaofCalls(t, c)
	for i := 0; i < 3; i++ {
		start := time.Now()
		r, err := patientNoReplica.Allow(ctx, key, l)
		took := time.Since(start)
		if err != nil || r.Allowed || r.RetryAfter <= 0 {
			t.Fatalf("denial whose WAITAOF could not be satisfied: %+v, %v; want a denial and no error", r, err)
		}
		if took >= patient/2 {
			t.Fatalf("a denial took %s with a WAITAOF timeout of %s, want under half of it: it waited", took, patient)
		}
		t.Logf("a denial, with a missing replica asked for (timeout %s), took %s", patient, took)
	}
	enginetest.Want(t, "WAITAOFs sent for 3 denials", waitaofCalls(t, c), before)

	local := enginetest.New(t, c, engine.WithBatching(false), engine.WithDurableAck(1, 0, time.Second))
	key = enginetest.NewKey(t)
	enginetest.Want(t, "admitted with a local fsync", fillAll(t, local, []string{key}, l), l.Max)
	offset := func() string {
		t.Helper()
		info, err := valkeytest.ReadInfo(ctx, c, "replication")
		if err != nil {
			t.Fatal(err)
		}
		return info["master_repl_offset"]
	}
	before = waitaofCalls(t, c)
	offsetBefore := offset()
	var took5 []time.Duration
	for i := 0; i < 5; i++ {
		start := time.Now()
		if r := enginetest.MustAllowN(t, local, key, l, 1); r.Allowed {
			t.Fatalf("admitted past the limit: %+v, want a denial", r)
		}
		took5 = append(took5, time.Since(start).Round(time.Microsecond))
	}
	enginetest.Want(t, "replication offset after 5 denials (what they wrote)", offset(), offsetBefore)
	enginetest.Want(t, "WAITAOFs sent for 5 denials", waitaofCalls(t, c), before)
	t.Logf("5 denials with a local fsync asked took %v", took5)
}

// Leases are acknowledged as decisions are: a granted Acquire is followed by one WAITAOF, and a
// lease that no replica fsynced in time is an ErrUnavailable error; a denied Acquire sends none.
func TestDurableAckFollowsEveryGrantedLease(t *testing.T) {
	own := valkeytest.New(t, valkeytest.AppendOnly("always"))
	c := own.Client(t)
	e := enginetest.New(t, c, engine.WithDurableAck(1, 0, time.Second))
	key := enginetest.NewKey(t)
	before := waitaofCalls(t, c)
	mustAcquire(t, e, key, 1, time.Minute)
	enginetest.Want(t, "WAITAOFs after a granted Acquire", waitaofCalls(t, c), before+1)
	mustDeny(t, e, key, 1, time.Minute)
	enginetest.Want(t, "WAITAOFs after a denied Acquire", waitaofCalls(t, c), before+1)

	noReplica := enginetest.New(t, c, engine.WithDurableAck(1, 1, 50*time.Millisecond))
	if l, err := noReplica.Acquire(context.Background(), enginetest.NewKey(t), 1, time.Minute); !errors.Is(err, engine.ErrUnavailable) ||
		!strings.Contains(err.Error(), "replicas 0 of 1") {
		t.Fatalf("Acquire whose WAITAOF asks for a missing replica: %+v, %v; want ErrUnavailable saying so", l, err)
	}
}

// waitaofCalls is how many WAITAOF commands the server at c has run since its stats were reset.
func waitaofCalls(t *testing.T, c valkey.Client) int64 {
	t.Helper()
	info, err := valkeytest.ReadInfo(context.Background(), c, "commandstats")
	if err != nil {
		t.Fatal(err)
	}
	return info.CommandStats()["waitaof"].Calls
}

// failoverRun is what one failover experiment measured.
type failoverRun struct {
	toldYesBefore, toldYesFrozen, toldYesAfter int
	frozenErrors                               int
}

func (r failoverRun) overAdmitted(max int) int {
	return r.toldYesBefore + r.toldYesFrozen + r.toldYesAfter - max
}

// A primary dies; its replica takes over and the engine keeps serving. Admissions the replica
// never received are lost, so the same window admits them again: over-admission. With
// WithReplicaAck an admission counts only once a replica holds it, and nothing is lost.
//
// To make the loss certain rather than a race, the replica's link is cut first: the engine's
// clients log in as their own user, the primary's default user (which the replica syncs as)
// is switched off, and the replica's connection is killed.
func TestClusterFailover(t *testing.T) {
	valkeytest.SkipIfShort(t, "starts a cluster")
	c := valkeytest.NewCluster(t, 3, 1)
	ctx := context.Background()
	onEvery(t, c.Nodes(), func(b valkey.Builder) valkey.Completed {
		return b.AclSetuser().Username("app").Rule("on", ">app-secret", "~*", "&*", "+@all").Build()
	})
	client := c.Client(t, valkey.ClientOption{Username: "app", Password: "app-secret"})
	// The replicas start without the scripts, so the promoted one must be served through the
	// NOSCRIPT fallback.
	onEvery(t, c.Replicas, func(b valkey.Builder) valkey.Completed { return b.ScriptFlush().Build() })
	const limit, before = 20, 10
	l := engine.PerHour(limit)

	run := func(t *testing.T, e *engine.Engine, primary, replica *valkeytest.Node) failoverRun {
		var r failoverRun
		key := keyOn(t, primary)
		for i := 0; i < before; i++ {
			if res, err := e.Allow(ctx, key, l); err != nil || !res.Allowed {
				t.Fatalf("before the cut: %+v, %v", res, err)
			}
			r.toldYesBefore++
		}
		// Every event so far is on the replica.
		waitReplicaHolds(t, ctx, replica, key, before)
		cutReplicaLink(t, ctx, client, primary, replica)
		for i := 0; i < limit-before; i++ {
			res, err := e.Allow(ctx, key, l)
			switch {
			case err != nil:
				if !errors.Is(err, engine.ErrUnavailable) {
					t.Fatalf("while the link is cut: %v, want ErrUnavailable", err)
				}
				r.frozenErrors++
			case res.Allowed:
				r.toldYesFrozen++
			}
		}

		primary.Crash()
		promoted, err := c.WaitPromoted(ctx, primary)
		if err != nil {
			t.Fatal(err)
		}
		if promoted != replica {
			t.Fatalf("promoted %s, want %s", promoted.Addr, replica.Addr)
		}
		// The engine keeps serving once the client has the new topology: no restart.
		var lastErr error
		if err := valkeytest.WaitFor(ctx, 30*time.Second, "the engine to decide after the failover", func() (bool, error) {
			res, err := e.Allow(ctx, key, l)
			if lastErr = err; err == nil && res.Allowed {
				r.toldYesAfter++
			}
			return err == nil, nil
		}); err != nil {
			t.Fatalf("engine did not recover after failover: %v (last: %v)", err, lastErr)
		}
		for i := 0; i < 2*limit; i++ {
			res, err := e.Allow(ctx, key, l)
			if err != nil {
				// The promoted node has no replica: acknowledged writes cannot succeed there.
				if errors.Is(err, engine.ErrUnavailable) {
					break
				}
				t.Fatal(err)
			}
			if res.Allowed {
				r.toldYesAfter++
			}
		}
		return r
	}

	t.Run("without replica ack the lost admissions are admitted again", func(t *testing.T) {
		e := enginetest.New(t, client)
		r := run(t, e, c.Primaries[0], c.Replicas[0])
		t.Logf("without ack: told yes %d before the cut, %d while cut, %d after failover: over-admitted %d of %d",
			r.toldYesBefore, r.toldYesFrozen, r.toldYesAfter, r.overAdmitted(limit), limit)
		enginetest.Want(t, "admitted while the replica was cut off", r.toldYesFrozen, limit-before)
		enginetest.Want(t, "over-admission (the lost events admitted again)", r.overAdmitted(limit), limit-before)
	})

	t.Run("leases", func(t *testing.T) {
		testLeaseFailover(t, c, client, c.Primaries[2], c.Replicas[2])
	})

	t.Run("with replica ack none is lost", func(t *testing.T) {
		e := enginetest.New(t, client, engine.WithReplicaAck(1, 200*time.Millisecond))
		primary, replica := c.Primaries[1], c.Replicas[1]
		r := run(t, e, primary, replica)
		// The promoted primary has no replica of its own until the old node returns, so every
		// admission there is refused (ErrUnavailable) and, recorded on it all the same, takes
		// room: with ack a failover costs availability and may under-admit, never over-admit.
		t.Logf("with ack: told yes %d before the cut, %d while cut (%d refused), %d after failover: over-admitted %d of %d",
			r.toldYesBefore, r.toldYesFrozen, r.frozenErrors, r.toldYesAfter, max(0, r.overAdmitted(limit)), limit)
		enginetest.Want(t, "admitted while the replica was cut off", r.toldYesFrozen, 0)
		enginetest.Want(t, "refused while the replica was cut off", r.frozenErrors, limit-before)
		if over := r.overAdmitted(limit); over > 0 {
			t.Fatalf("over-admitted %d with replica ack, want 0", over)
		}
	})
}

// Leases fail over as the rate log does (replication is asynchronous): a lease granted while
// the replica's link was cut is lost with the primary, and its slot is granted again after
// the failover, one holder over max per lost lease. The lost lease's holder learns it at its
// next Extend (ErrLeaseExpired); leases the replica held keep their slots and extend on the
// promoted node. With WithReplicaAck a grant no replica acknowledged is an error instead.
func testLeaseFailover(t *testing.T, c *valkeytest.Cluster, client valkey.Client, primary, replica *valkeytest.Node) {
	ctx := context.Background()
	e := enginetest.New(t, client)
	acked := enginetest.New(t, client, engine.WithReplicaAck(1, 200*time.Millisecond))
	const max, ttl = 4, time.Minute
	key, other := leaseKeyOn(t, primary), leaseKeyOn(t, primary)
	kept := []engine.Lease{mustAcquire(t, e, key, max, ttl), mustAcquire(t, e, key, max, ttl), mustAcquire(t, acked, key, max, ttl)}
	waitReplicaLeases(t, ctx, replica, key, int64(len(kept)))

	cutReplicaLink(t, ctx, client, primary, replica)
	lost := mustAcquire(t, e, key, max, ttl) // granted on the primary alone
	mustDeny(t, e, key, max, ttl)
	if l, err := acked.Acquire(ctx, other, max, ttl); !errors.Is(err, engine.ErrUnavailable) {
		t.Fatalf("acknowledged Acquire while the replica is cut off: %+v, %v; want ErrUnavailable", l, err)
	}

	primary.Crash()
	if promoted, err := c.WaitPromoted(ctx, primary); err != nil || promoted != replica {
		t.Fatalf("promoted %v, %v; want %s", promoted, err, replica.Addr)
	}
	var again engine.Lease
	var lastErr error
	if err := valkeytest.WaitFor(ctx, 30*time.Second, "the engine to grant leases after the failover", func() (bool, error) {
		again, lastErr = e.Acquire(ctx, key, max, ttl)
		return lastErr == nil, nil
	}); err != nil {
		t.Fatalf("no lease after the failover: %v (last: %v)", err, lastErr)
	}
	mustDeny(t, e, key, max, ttl)
	// The promoted node holds the kept leases and the new one; the lost one is gone, though its
	// holder still runs: one holder over max.
	pc := replica.Client()
	members := valkeytest.Must(t, "ZRANGE", pc.Do(ctx, pc.B().Zrange().Key(leaseKey(key)).Min("0").Max("-1").Build()), valkey.ValkeyResult.AsStrSlice)
	enginetest.Want(t, "leases on the promoted node", len(members), len(kept)+1)
	for _, m := range members {
		if m == string(lost.ID[:]) {
			t.Fatal("the lease granted while the link was cut survived the failover, want it lost with the primary")
		}
	}
	t.Logf("leases: %d kept by the replica, 1 lost with the primary and granted again: %d holders believe they hold one of %d slots",
		len(kept), len(kept)+2, max)

	if _, err := e.Extend(ctx, lost, ttl); !errors.Is(err, engine.ErrLeaseExpired) {
		t.Fatalf("Extend of the lease lost in the failover: %v, want ErrLeaseExpired", err)
	}
	mustRelease(t, e, lost) // a no-op: it frees nobody's slot
	mustDeny(t, e, key, max, ttl)
	for _, l := range kept {
		if _, err := e.Extend(ctx, l, ttl); err != nil {
			t.Fatalf("Extend of a lease the replica held: %v", err)
		}
	}
	mustRelease(t, e, again)
}

// cutReplicaLink stops replica from replicating primary without stopping either: the
// primary's default user (which the replica syncs as) is switched off through client, which
// logs in as its own user, and the replica's connection is killed.
func cutReplicaLink(t *testing.T, ctx context.Context, client valkey.Client, primary, replica *valkeytest.Node) {
	t.Helper()
	// Sent as app (the engine's client's connection to the primary), which stays logged in.
	pc := client.Nodes()[primary.Addr]
	if pc == nil {
		t.Fatalf("the engine's client has no connection to %s", primary.Addr)
	}
	for _, cmd := range []valkey.Completed{
		pc.B().AclSetuser().Username("default").Rule("off").Build(),
		pc.B().ClientKill().TypeReplica().Build(),
	} {
		if err := pc.Do(ctx, cmd).Error(); err != nil {
			t.Fatal(err)
		}
	}
	waitLinkDown(t, ctx, replica)
}

// waitReplicaLeases waits until replica's copy of key's lease set holds n leases.
func waitReplicaLeases(t *testing.T, ctx context.Context, replica *valkeytest.Node, key string, n int64) {
	t.Helper()
	rc := replica.Client()
	var got int64
	if err := valkeytest.WaitFor(ctx, 5*time.Second, "the replica to hold every lease", func() (bool, error) {
		rs := rc.DoMulti(ctx, rc.B().Readonly().Build(), rc.B().Zcard().Key(leaseKey(key)).Build())
		var err error
		got, err = rs[1].AsInt64()
		return err == nil && got == n, nil
	}); err != nil {
		t.Fatalf("replica %s holds %d leases, want %d: %v", replica.Addr, got, n, err)
	}
}

func waitReplicaHolds(t *testing.T, ctx context.Context, replica *valkeytest.Node, key string, n int64) {
	t.Helper()
	rc := replica.Client()
	var got int64
	var err error
	if werr := valkeytest.WaitFor(ctx, 5*time.Second, "the replica to hold every event", func() (bool, error) {
		// The inspect script, read-only, on the replica: its reply opens with the log's events.
		inspect := rc.B().EvalRo().Script(scripts.Source("inspect")).Numkeys(1).Key(enginetest.Prefix + key).Arg("1").Build()
		rs := rc.DoMulti(ctx, rc.B().Readonly().Build(), inspect)
		var log []int64
		if log, err = rs[1].AsIntSlice(); err == nil {
			got = log[0]
		}
		return err == nil && got == n, nil
	}); werr != nil {
		t.Fatalf("replica %s holds %d events (%v), want %d: %v", replica.Addr, got, err, n, werr)
	}
}

func waitLinkDown(t *testing.T, ctx context.Context, replica *valkeytest.Node) {
	t.Helper()
	if err := valkeytest.WaitFor(ctx, 10*time.Second, "the replica's link to go down", func() (bool, error) {
		info, err := valkeytest.ReadInfo(ctx, replica.Client(), "replication")
		return info["master_link_status"] == "down", err
	}); err != nil {
		t.Fatalf("replica %s: %v", replica.Addr, err)
	}
}
