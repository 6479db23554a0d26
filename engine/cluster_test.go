package engine_test

import (
	"context"
	"errors"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/valkey-io/valkey-go"

	"github.com/strictrate/strictrate/engine"
	"github.com/strictrate/strictrate/internal/enginetest"
	"github.com/strictrate/strictrate/internal/valkeytest"
	"github.com/strictrate/strictrate/loader"
	"github.com/strictrate/strictrate/scripts"
)

func skipClusterIfShort(t *testing.T) {
	t.Helper()
	if testing.Short() {
		t.Skip("cluster tests start several servers; skipped with -short")
	}
}

// keyOn returns a fresh user key whose full key (with the engine's prefix) lands in node's
// slots.
func keyOn(t *testing.T, node *valkeytest.Node) string {
	t.Helper()
	return keyUnder(t, node, enginetest.Prefix)
}

// leaseKeyOn returns a fresh user key whose lease set lands in node's slots.
func leaseKeyOn(t *testing.T, node *valkeytest.Node) string {
	t.Helper()
	return keyUnder(t, node, enginetest.Prefix+engine.LeaseNamespace)
}

// keyUnder returns a fresh user key that, after full (a prefix), lands in node's slots.
func keyUnder(t *testing.T, node *valkeytest.Node, full string) string {
	t.Helper()
	for i := 0; i < 10_000; i++ {
		if key := uuid.NewString(); node.Owns(full + key) {
			return key
		}
	}
	t.Fatalf("no key found for slots %d-%d", node.First, node.Last)
	return ""
}

// onEvery sends the command build makes to each node, on its own client, and fails t on an error.
func onEvery(t *testing.T, nodes []*valkeytest.Node, build func(valkey.Builder) valkey.Completed) {
	t.Helper()
	for _, n := range nodes {
		c := n.Client()
		if err := c.Do(context.Background(), build(c.B())).Error(); err != nil {
			t.Fatalf("%s: %v", n.Addr, err)
		}
	}
}

// commandStats reads a node's INFO commandstats.
func commandStats(t *testing.T, n *valkeytest.Node) map[string]valkeytest.CommandStat {
	t.Helper()
	info, err := valkeytest.ReadInfo(context.Background(), n.Client(), "commandstats")
	if err != nil {
		t.Fatalf("%s: %v", n.Addr, err)
	}
	return info.CommandStats()
}

// The engine runs on a cluster client unchanged: keys spread over every primary, the scripts
// are on every node, decisions stay exact on each primary, NOSCRIPT is handled, and Peek can
// be served by replicas.
func TestCluster(t *testing.T) {
	skipClusterIfShort(t)
	c := valkeytest.NewCluster(t, 3, 1)
	ctx := context.Background()
	var clients []valkey.Client
	var es []*engine.Engine
	for i := 0; i < 4; i++ {
		client := c.Client(t, valkey.ClientOption{})
		clients = append(clients, client)
		es = append(es, enginetest.New(t, client))
	}

	t.Run("scripts on every node", func(t *testing.T) {
		// A client that reads from replicas knows every node, and New loads both scripts on
		// all of them; a plain client knows the primaries only, and a replica that takes over
		// later gets the script through the NOSCRIPT fallback (TestClusterFailover).
		rc := c.Client(t, valkey.ClientOption{SendToReplicas: engine.SendPeeksToReplicas})
		onEvery(t, c.Nodes(), func(b valkey.Builder) valkey.Completed { return b.ScriptFlush().Build() })
		enginetest.New(t, rc)
		shas := []string{loader.New("", scripts.Source("decide", 0)).SHA1(), loader.New("", scripts.Source("peek", 0)).SHA1()}
		if len(rc.Nodes()) != 6 {
			t.Fatalf("client knows %d nodes, want 6", len(rc.Nodes()))
		}
		for addr, node := range rc.Nodes() {
			got, err := node.Do(ctx, node.B().ScriptExists().Sha1(shas...).Build()).AsIntSlice()
			if err != nil || len(got) != 2 || got[0] != 1 || got[1] != 1 {
				t.Fatalf("SCRIPT EXISTS on %s = %v, %v; want [1 1]", addr, got, err)
			}
		}
	})

	t.Run("keys on every primary", func(t *testing.T) {
		// Concurrent decisions on keys of every slot: a batch holds one slot's keys, and each
		// decision lands on its key's primary.
		var next atomic.Int64
		enginetest.RunConcurrently(t, es, 32, 300, func(e *engine.Engine) (engine.Result, error) {
			return e.Allow(ctx, "spread:"+strconv.Itoa(int(next.Add(1))), engine.PerMinute(5))
		})
		for _, p := range c.Primaries {
			pc := p.Client()
			if keys := valkeytest.Must(t, "DBSIZE", pc.Do(ctx, pc.B().Dbsize().Build()), valkey.ValkeyResult.AsInt64); keys < 50 {
				t.Fatalf("primary %s holds %d of 300 keys; want them spread", p.Addr, keys)
			}
		}
	})

	t.Run("exact on each primary", func(t *testing.T) {
		// Batching is on (the default): the decisions on one key share a slot, so they batch;
		// the primary runs fewer script calls than decisions.
		for _, p := range c.Primaries {
			key, l := keyOn(t, p), engine.PerHour(100)
			pc := p.Client()
			resetStats(t, pc)
			results := enginetest.RunConcurrently(t, es, 64, 500, func(e *engine.Engine) (engine.Result, error) {
				return e.Allow(ctx, key, l)
			})
			if calls := scriptCalls(t, pc); calls >= 500 {
				t.Fatalf("primary %s: 500 decisions in %d script calls: not batched", p.Addr, calls)
			}
			admitted := 0
			for _, r := range results {
				if r.Allowed {
					admitted++
				}
			}
			if admitted != l.Max {
				t.Fatalf("primary %s: %d admitted, want %d", p.Addr, admitted, l.Max)
			}
			if n := enginetest.StoredEvents(t, clients[0], key); n != int64(l.Max) {
				t.Fatalf("primary %s: log holds %d, want %d", p.Addr, n, l.Max)
			}
		}
	})

	t.Run("leases exact on each primary", func(t *testing.T) {
		for _, p := range c.Primaries {
			key, max := leaseKeyOn(t, p), 3
			l := mustAcquire(t, es[0], key, max, time.Minute)
			pc := p.Client()
			if n := valkeytest.Must(t, "EXISTS", pc.Do(ctx, pc.B().Exists().Key(leaseKey(key)).Build()), valkey.ValkeyResult.AsInt64); n != 1 {
				t.Fatalf("primary %s does not hold the lease set of a key in its slots", p.Addr)
			}
			mustRelease(t, es[1], l)
			actx, cancel := context.WithTimeout(ctx, 30*time.Second)
			a := auditHolders(t, actx, es, key, max, 32, 1)
			cancel()
			if a.peak > int64(max) || a.through != 32 || a.denials == 0 {
				t.Fatalf("primary %s: %d holders at once (max %d), %d of 32 through, %d denials", p.Addr, a.peak, max, a.through, a.denials)
			}
			enginetest.Want(t, "leases left on "+p.Addr, leaseCount(t, clients[0], key), int64(0))
		}
	})

	t.Run("NOSCRIPT after a flush on every node", func(t *testing.T) {
		onEvery(t, c.Nodes(), func(b valkey.Builder) valkey.Completed { return b.ScriptFlush().Build() })
		for _, p := range c.Primaries {
			key := keyOn(t, p)
			enginetest.Want(t, "allow after flush", enginetest.MustAllowN(t, es[0], key, engine.PerMinute(2), 1).Remaining, 1)
			enginetest.Want(t, "peek after flush", enginetest.MustPeek(t, es[1], key, engine.PerMinute(2)).Remaining, 1)
		}
	})

	t.Run("Peek served by replicas", func(t *testing.T) {
		rc := c.Client(t, valkey.ClientOption{SendToReplicas: engine.SendPeeksToReplicas})
		// Acknowledged by a replica before Allow returns, so the replica's copy is current.
		e := enginetest.New(t, rc, engine.WithReplicaAck(1, 2*time.Second))
		onEvery(t, c.Nodes(), func(b valkey.Builder) valkey.Completed { return b.ConfigResetstat().Build() })
		for _, p := range c.Primaries {
			key, l := keyOn(t, p), engine.PerMinute(10)
			enginetest.MustAllowN(t, e, key, l, 3)
			for i := 0; i < 5; i++ {
				enginetest.Want(t, "peek on a replica: remaining", enginetest.MustPeek(t, e, key, l).Remaining, 7)
			}
		}
		for _, r := range c.Replicas {
			if s := commandStats(t, r); s["evalsha_ro"].Calls+s["eval_ro"].Calls == 0 {
				t.Fatalf("replica %s served no read-only script", r.Addr)
			}
		}
		for _, p := range c.Primaries {
			s := commandStats(t, p)
			if ro, ok := s["evalsha_ro"]; ok {
				t.Fatalf("primary %s served read-only scripts: %+v", p.Addr, ro)
			}
			if s["evalsha"].Calls+s["eval"].Calls == 0 {
				t.Fatalf("primary %s served no decision", p.Addr)
			}
		}
	})
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
	skipClusterIfShort(t)
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

	t.Run("without replica ack", func(t *testing.T) {
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

	t.Run("with replica ack", func(t *testing.T) {
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
			t.Fatalf("over-admitted %d with replica ack", over)
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
			t.Fatal("the lease granted while the link was cut survived the failover")
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
		inspect := rc.B().EvalRo().Script(scripts.Source("inspect", 0)).Numkeys(1).Key(enginetest.Prefix + key).Arg("1").Build()
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
