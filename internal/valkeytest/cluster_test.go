package valkeytest

import (
	"context"
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
