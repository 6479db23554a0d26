package valkeytest

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"
)

func TestClusterStartsHealthyAndStops(t *testing.T) {
	ctx := context.Background()
	c, err := StartCluster(ctx, 3, 1)
	if err != nil {
		t.Fatal(err)
	}
	if len(c.Primaries) != 3 || len(c.Replicas) != 3 {
		t.Fatalf("%d primaries, %d replicas", len(c.Primaries), len(c.Replicas))
	}
	for i, n := range c.Nodes() {
		role, err := n.Role(ctx)
		want := "master"
		if i >= 3 {
			want = "slave"
		}
		if err != nil || role != want {
			t.Fatalf("node %d role %q (%v), want %s", i, role, err, want)
		}
	}
	if c.Primaries[0].First != 0 || c.Primaries[2].Last != 16383 {
		t.Fatalf("slots %d-%d ... %d-%d", c.Primaries[0].First, c.Primaries[0].Last, c.Primaries[2].First, c.Primaries[2].Last)
	}
	// KeySlot computes here what the server answers, hash tags included.
	node := c.Primaries[0].Client()
	for _, key := range []string{"", "foo", "strictrate:user:1", "{user1000}.following", "x{user1000}y", "a{}b", "{}{b}", "{a", "\x00\xff"} {
		want, err := node.Do(ctx, node.B().ClusterKeyslot().Key(key).Build()).AsInt64()
		if err != nil || int64(KeySlot(key)) != want {
			t.Fatalf("KeySlot(%q) = %d; CLUSTER KEYSLOT says %d (%v)", key, KeySlot(key), want, err)
		}
	}
	addrs := c.Addrs()
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	for _, a := range addrs {
		if err := ping(ctx, a); err == nil {
			t.Fatalf("node %s still answers after Close", a)
		}
	}
}

func TestClusterPromotesAReplicaWhenAPrimaryCrashes(t *testing.T) {
	c := NewCluster(t, 3, 1)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	old := c.Primaries[1]
	old.Crash()
	if old.Alive() {
		t.Fatal("crashed node still alive")
	}
	n, err := c.WaitPromoted(ctx, old)
	if err != nil {
		t.Fatal(err)
	}
	if n != c.Replicas[1] {
		t.Fatalf("promoted %s, want the old primary's replica %s", n.Addr, c.Replicas[1].Addr)
	}
}

// A slot moves in steps: while it migrates, the source serves the keys it still holds and
// sends the others to the target (ASK), the target serves a moved key to a client that says
// ASKING; once finished, every primary names the target as the slot's owner and the keys are
// all there.
func TestClusterMigratesASlotInSteps(t *testing.T) {
	c := NewCluster(t, 3, 0)
	ctx := context.Background()
	from, to := c.Primaries[0], c.Primaries[1]
	slot := from.First + 7
	keys := []string{KeyInSlot("migrate:a:", slot), KeyInSlot("migrate:b:", slot)}
	if keys[0] == keys[1] || KeySlot(keys[1]) != slot {
		t.Fatalf("keys %v for slot %d", keys, slot)
	}
	fc, tc := from.Client(), to.Client()
	for _, k := range keys {
		if err := fc.Do(ctx, fc.B().Set().Key(k).Value("v").Build()).Error(); err != nil {
			t.Fatal(err)
		}
	}
	m, err := c.BeginMigration(ctx, slot, from, to)
	if err != nil {
		t.Fatal(err)
	}
	// One key moves; the source serves the other and redirects the moved one.
	if moved, err := m.MoveKeys(ctx, 1); err != nil || moved != 1 {
		t.Fatalf("MoveKeys(1) = %d, %v", moved, err)
	}
	var onSource, asked int
	for _, k := range keys {
		err := fc.Do(ctx, fc.B().Get().Key(k).Build()).Error()
		switch {
		case err == nil:
			onSource++
		case strings.HasPrefix(err.Error(), "ASK "+strconv.Itoa(slot)+" "+to.Addr):
			asked++
			rs := tc.DoMulti(ctx, tc.B().Asking().Build(), tc.B().Get().Key(k).Build())
			if v, err := rs[1].ToString(); err != nil || v != "v" {
				t.Fatalf("GET %s on the target after ASKING: %q, %v", k, v, err)
			}
		default:
			t.Fatalf("GET %s on the source while migrating: %v", k, err)
		}
	}
	if onSource != 1 || asked != 1 {
		t.Fatalf("while migrating: %d keys served by the source, %d sent on with ASK; want 1 and 1", onSource, asked)
	}
	if err := m.Finish(ctx); err != nil {
		t.Fatal(err)
	}
	for _, p := range c.Primaries {
		if owner, err := p.SlotOwner(ctx, slot); err != nil || owner != to.Addr {
			t.Fatalf("%s says slot %d is %q's (%v), want %s", p.Addr, slot, owner, err, to.Addr)
		}
	}
	for _, k := range keys {
		if v, err := tc.Do(ctx, tc.B().Get().Key(k).Build()).ToString(); err != nil || v != "v" {
			t.Fatalf("GET %s on the target after the migration: %q, %v", k, v, err)
		}
	}
}
