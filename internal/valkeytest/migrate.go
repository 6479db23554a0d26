package valkeytest

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"time"
)

// Migration moves one slot from one primary to another in the steps valkey-cli --cluster
// reshard takes, each a call of its own, so that a test can run traffic between them: Begin
// marks the slot IMPORTING on the target and MIGRATING on the source; MoveKeys moves some of
// its keys with MIGRATE (a key moved is served by the target, through ASK, before the slot
// is); Finish hands the slot to the target on every primary. Between Begin and Finish the
// source serves the slot's keys it still holds and redirects the others with ASK (a call whose
// keys are split between the two gets TRYAGAIN), as a server does during a real resharding.
//
// The Node ranges (First, Last, Owns) say what the nodes owned when the cluster started, and
// stay so: after Finish the slot is the target's.
type Migration struct {
	// Slot is the slot being moved.
	Slot int
	// From and To are the primaries it moves from and to.
	From, To *Node

	c *Cluster
}

// migrateTimeout is MIGRATE's timeout for one batch of keys.
const migrateTimeout = 5 * time.Second

// BeginMigration marks slot IMPORTING on to and then MIGRATING on from, the order
// valkey-cli uses (a slot migrating with no importer would send clients nowhere).
func (c *Cluster) BeginMigration(ctx context.Context, slot int, from, to *Node) (*Migration, error) {
	if from == to {
		return nil, fmt.Errorf("valkeytest: migrate slot %d from %s to itself", slot, from.Addr)
	}
	tc := to.client
	if err := tc.Do(ctx, tc.B().ClusterSetslot().Slot(int64(slot)).Importing().NodeId(from.ID).Build()).Error(); err != nil {
		return nil, fmt.Errorf("valkeytest: CLUSTER SETSLOT %d IMPORTING on %s: %w", slot, to.Addr, err)
	}
	fc := from.client
	if err := fc.Do(ctx, fc.B().ClusterSetslot().Slot(int64(slot)).Migrating().NodeId(to.ID).Build()).Error(); err != nil {
		return nil, fmt.Errorf("valkeytest: CLUSTER SETSLOT %d MIGRATING on %s: %w", slot, from.Addr, err)
	}
	return &Migration{Slot: slot, From: from, To: to, c: c}, nil
}

// MoveKeys moves up to count of the slot's keys still on the source to the target (CLUSTER
// GETKEYSINSLOT, then MIGRATE), and returns how many it moved.
func (m *Migration) MoveKeys(ctx context.Context, count int) (int, error) {
	fc := m.From.client
	keys, err := fc.Do(ctx, fc.B().ClusterGetkeysinslot().Slot(int64(m.Slot)).Count(int64(count)).Build()).AsStrSlice()
	if err != nil {
		return 0, fmt.Errorf("valkeytest: CLUSTER GETKEYSINSLOT %d on %s: %w", m.Slot, m.From.Addr, err)
	}
	if len(keys) == 0 {
		return 0, nil
	}
	// One MIGRATE per key: the server counts the empty key of MIGRATE's KEYS form as a key of
	// slot 0, and refuses the form for other slots (CROSSSLOT).
	for i, k := range keys {
		if err := m.MoveKey(ctx, k); err != nil {
			return i, err
		}
	}
	return len(keys), nil
}

// MoveKey moves key, which must be of the slot and on the source, to the target.
func (m *Migration) MoveKey(ctx context.Context, key string) error {
	if KeySlot(key) != m.Slot {
		return fmt.Errorf("valkeytest: key %q is of slot %d, not the migrating slot %d", key, KeySlot(key), m.Slot)
	}
	host, portText, err := net.SplitHostPort(m.To.Addr)
	if err != nil {
		return err
	}
	port, err := strconv.ParseInt(portText, 10, 64)
	if err != nil {
		return err
	}
	fc := m.From.client
	migrate := fc.B().Migrate().Host(host).Port(port).Key(key).DestinationDb(0).Timeout(migrateTimeout.Milliseconds()).Build()
	if err := fc.Do(ctx, migrate).Error(); err != nil {
		return fmt.Errorf("valkeytest: MIGRATE %q of slot %d from %s to %s: %w", key, m.Slot, m.From.Addr, m.To.Addr, err)
	}
	return nil
}

// MoveAllKeys moves every key of the slot still on the source, batch by batch of count, and
// returns how many it moved.
func (m *Migration) MoveAllKeys(ctx context.Context, count int) (int, error) {
	total := 0
	for {
		n, err := m.MoveKeys(ctx, count)
		total += n
		if err != nil || n == 0 {
			return total, err
		}
	}
}

// Finish moves the keys left on the source, then assigns the slot to the target: first on the
// target, then on the source, then on every other live primary (CLUSTER SETSLOT NODE), as
// valkey-cli does; the cluster bus spreads it to the replicas.
func (m *Migration) Finish(ctx context.Context) error {
	if _, err := m.MoveAllKeys(ctx, 100); err != nil {
		return err
	}
	nodes := []*Node{m.To, m.From}
	for _, p := range m.c.Primaries {
		if p != m.To && p != m.From && p.Alive() {
			nodes = append(nodes, p)
		}
	}
	for _, n := range nodes {
		cl := n.client
		if err := cl.Do(ctx, cl.B().ClusterSetslot().Slot(int64(m.Slot)).Node().NodeId(m.To.ID).Build()).Error(); err != nil {
			return fmt.Errorf("valkeytest: CLUSTER SETSLOT %d NODE %s on %s: %w", m.Slot, m.To.ID, n.Addr, err)
		}
	}
	return nil
}

// SlotOwner returns the address of the primary that serves slot as node n's CLUSTER SLOTS
// says.
func (n *Node) SlotOwner(ctx context.Context, slot int) (string, error) {
	ranges, err := n.client.Do(ctx, n.client.B().ClusterSlots().Build()).ToArray()
	if err != nil {
		return "", fmt.Errorf("valkeytest: CLUSTER SLOTS on %s: %w", n.Addr, err)
	}
	for _, r := range ranges {
		fields, err := r.ToArray()
		if err != nil || len(fields) < 3 {
			continue
		}
		first, _ := fields[0].AsInt64()
		last, _ := fields[1].AsInt64()
		if int64(slot) < first || int64(slot) > last {
			continue
		}
		primary, err := fields[2].ToArray()
		if err != nil || len(primary) < 2 {
			return "", fmt.Errorf("valkeytest: CLUSTER SLOTS on %s: slot %d's primary: %v", n.Addr, slot, r)
		}
		host, _ := primary[0].ToString()
		port, _ := primary[1].AsInt64()
		return net.JoinHostPort(host, strconv.FormatInt(port, 10)), nil
	}
	return "", fmt.Errorf("valkeytest: CLUSTER SLOTS on %s: no primary serves slot %d", n.Addr, slot)
}

// KeyInSlot returns prefix followed by the first number (0, 1, 2 ...) that makes a key of
// slot: about 16384 tries.
func KeyInSlot(prefix string, slot int) string {
	for i := 0; ; i++ {
		if key := prefix + strconv.Itoa(i); KeySlot(key) == slot {
			return key
		}
	}
}
