package engine_test

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/valkey-io/valkey-go"

	"github.com/strictrate/strictrate/engine"
	"github.com/strictrate/strictrate/internal/enginetest"
	"github.com/strictrate/strictrate/internal/valkeytest"
	"github.com/strictrate/strictrate/loader"
	"github.com/strictrate/strictrate/scripts"
)

// A user whose ACL lets it load scripts but not run them, or not run a command the scripts
// need, is refused by New with ErrPreload naming what is missing, not by the first decision.
func TestNewChecksTheUsersPermissions(t *testing.T) {
	own := valkeytest.New(t, valkeytest.OwnServer())
	for _, tc := range []struct {
		user  string
		rules []string
		names string // what the error must name
	}{
		{"noevalsha", []string{"+@all", "-evalsha"}, "EVALSHA"},
		{"noevalsharo", []string{"+@all", "-evalsha_ro"}, "EVALSHA_RO"},
		{"nopexpire", []string{"+@all", "-pexpire"}, "PEXPIRE"},
		{"nolset", []string{"+@all", "-lset"}, "LSET"},
		{"nozadd", []string{"+@all", "-zadd"}, "ZADD"},
	} {
		t.Run(tc.user, func(t *testing.T) {
			c := own.NewUser(t, tc.user, "pw", tc.rules...)
			_, err := engine.New(c, engine.WithPersistenceCheck(engine.Ignore))
			if !errors.Is(err, engine.ErrPreload) || errors.Is(err, engine.ErrUnavailable) || !strings.Contains(err.Error(), tc.names) {
				t.Fatalf("New as a user without %s: %v; want ErrPreload naming it", tc.names, err)
			}
		})
	}
	// A user allowed only the engine's keys, and everything the engine runs, passes.
	c := own.NewUser(t, "keysonly", "pw", "+@all", "resetkeys", "~strictrate:*")
	if _, err := engine.New(c, engine.WithPersistenceCheck(engine.Ignore)); err != nil {
		t.Fatalf("New as a user limited to the engine's keys: %v", err)
	}
	d := own.NewUser(t, "otherkeys", "pw", "+@all", "resetkeys", "~other:*")
	if _, err := engine.New(d, engine.WithPersistenceCheck(engine.Ignore)); !errors.Is(err, engine.ErrPreload) {
		t.Fatalf("New as a user that may not touch the engine's keys: %v; want ErrPreload", err)
	}
}

// A server that refuses scripting fails engine.New, not the first request, and the error says
// why; WithPreload(false) defers the failure to the first decision.
func TestNewFailsWhenScriptingIsRefused(t *testing.T) {
	own := valkeytest.New(t, valkeytest.OwnServer())
	c := own.NewUser(t, "noscripts", "secret", "+@all", "-@scripting")
	ctx := context.Background()

	_, err := engine.New(c)
	if !errors.Is(err, engine.ErrPreload) || errors.Is(err, engine.ErrUnavailable) {
		t.Fatalf("New without scripting: %v, want a preload error that is not ErrUnavailable", err)
	}
	e := enginetest.New(t, c, engine.WithPreload(false))
	if _, err := e.Allow(ctx, enginetest.NewKey(t), engine.PerMinute(1)); err == nil || errors.Is(err, engine.ErrUnavailable) {
		t.Fatalf("Allow without scripting: %v, want the server's refusal", err)
	}
}

func TestResetForgetsTheKey(t *testing.T) {
	c := exampleServer.Client(t)
	e := enginetest.New(t, c)
	key, l := enginetest.NewKey(t), engine.PerMinute(2)
	enginetest.MustAllowN(t, e, key, l, 2)
	enginetest.Want(t, "full", enginetest.MustAllowN(t, e, key, l, 1).Allowed, false)
	if err := e.Reset(context.Background(), key); err != nil {
		t.Fatal(err)
	}
	enginetest.Want(t, "log size after Reset", enginetest.StoredEvents(t, c, key), int64(0))
	r := enginetest.MustAllowN(t, e, key, l, 1)
	enginetest.Want(t, "after Reset: allowed", r.Allowed, true)
	enginetest.Want(t, "after Reset: remaining", r.Remaining, 1)
}

// The engine runs on a cluster client unchanged: keys spread over every primary, the scripts
// are on every node, decisions stay exact on each primary, NOSCRIPT is handled, and Peek can
// be served by replicas.
func TestEngineRunsUnchangedOnAClusterClient(t *testing.T) {
	valkeytest.SkipIfShort(t, "starts a cluster")
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
		shas := []string{loader.New("", scripts.Source("decide")).SHA1(), loader.New("", scripts.Source("peek")).SHA1()}
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

	t.Run("charges on each primary", func(t *testing.T) {
		// Allows and charges of 2 events mixed, batched together: every charge is recorded,
		// and what was admitted or fit stops at Max, on the key's own primary.
		for _, p := range c.Primaries {
			key, l := keyOn(t, p), engine.PerHour(100)
			var calls atomic.Int64
			results := enginetest.RunConcurrently(t, es, 64, 500, func(e *engine.Engine) (engine.Result, error) {
				if calls.Add(1)%5 == 0 {
					return e.Charge(ctx, key, l, 2)
				}
				return e.Allow(ctx, key, l)
			})
			recorded, within, overCharges := 0, 0, 0
			for _, r := range results {
				switch {
				case r.Entry.Cost == 2:
					recorded += 2
					if r.Allowed {
						within += 2
					} else {
						overCharges++
					}
				case r.Allowed:
					recorded++
					within++
				}
			}
			if within < l.Max-1 || within > l.Max || overCharges == 0 {
				t.Fatalf("primary %s: %d events admitted or fit, %d charges over; want Max %d (or one less, a charge of 2 not fitting) and some over",
					p.Addr, within, overCharges, l.Max)
			}
			if n := enginetest.StoredEvents(t, clients[0], key); n != int64(recorded) {
				t.Fatalf("primary %s: log holds %d, want %d: every admission and every charge", p.Addr, n, recorded)
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
				t.Fatalf("primary %s: %d holders at once, %d of 32 through, %d denials; want at most %d at once, all through, some denials", p.Addr, a.peak, a.through, a.denials, max)
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
