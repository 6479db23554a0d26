package transport

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/valkey-io/valkey-go"

	"github.com/strictrate/strictrate/internal/sendctx"
)

// In a cluster, a batch goes to the primary that serves its keys' slots, as one call of the
// batch script that reaches keys of several of that node's slots (commit.go). valkey-go keeps
// the slot map it routes by to itself, so the transport keeps its own: a slotMap, loaded with
// CLUSTER SLOTS the first time a request asks for it, and again when a call finds a key the
// node does not serve (a slot that moved, a failover): at most once per slotMapReloadEvery,
// never twice at once, and never dropped (one asked for meanwhile follows the one in flight).
// Until the first load lands a request is routed by its slot, through the engine's client; a
// stale map costs a retry (each request that the node did not take goes again on its own
// through the engine's client, which follows MOVED and ASK: the retry rule, retry.go), never
// a wrong decision.
const (
	// numSlots is the number of hash slots of a Valkey Cluster.
	numSlots = 16384
	// slotMapReloadEvery is the least time between two loads of a slot map.
	slotMapReloadEvery = 100 * time.Millisecond
	// slotMapLoadTimeout bounds one load: each node asked in turn shares it.
	slotMapLoadTimeout = 2 * time.Second
	// nodeClientsMaxAge is how long the node clients taken from the engine's client
	// (valkey.Client.Nodes) are used before they are taken again. valkey-go closes a
	// connection it dropped from its topology five seconds after dropping it, and a call on a
	// closed one fails with valkey.ErrClosing, which the engine cannot tell from a call cut
	// short once sent: clients at most a second old never hold one.
	nodeClientsMaxAge = time.Second
)

// slotMap is a cluster's map from hash slot to the address of the primary that serves it, and
// clients to each node, shared by every kind's committers. Its zero value is not usable: see
// newSlotMap.
type slotMap struct {
	client valkey.Client // the engine's cluster client

	table    atomic.Pointer[slotTable] // nil until the first load lands
	dirty    atomic.Bool               // a load was asked for since the last one started
	loading  atomic.Bool               // a goroutine loads (loadWhileDirty)
	lastLoad atomic.Int64              // when the last load started, in Unix nanoseconds; 0 never
	loads    atomic.Int64              // loads that landed, for tests

	nodesMu sync.Mutex                  // held while Nodes() is taken
	nodes   atomic.Pointer[nodeClients] // nil until first asked for
}

// slotTable is one load of a slot map: owner[slot] is the index in addrs of the slot's
// primary, or -1 when no primary serves it.
type slotTable struct {
	owner [numSlots]int16
	addrs []string
}

// nodeClients is the engine's client's Nodes(), and when it was taken.
type nodeClients struct {
	at      time.Time
	clients map[string]valkey.Client
}

// newSlotMap is the slot map of the cluster client, loaded when first asked.
func newSlotMap(client valkey.Client) *slotMap { return &slotMap{client: client} }

// primary returns the address of the primary that serves slot, as last loaded; false when no
// map has landed yet (the first call starts a load) or no primary serves the slot.
func (m *slotMap) primary(slot uint16) (string, bool) {
	t := m.table.Load()
	if t == nil {
		m.reload()
		return "", false
	}
	if i := t.owner[slot&(numSlots-1)]; i >= 0 {
		return t.addrs[i], true
	}
	return "", false
}

// reload asks for a load of the map, and returns at once: requests go on by the map they
// have meanwhile. Loads run on a goroutine of their own, one at a time, each at least
// slotMapReloadEvery after the one before; a reload asked for while one is in flight or too
// soon is not lost, but coalesced into the next load (dirty). A load that fails keeps the map
// as it was.
func (m *slotMap) reload() {
	m.dirty.Store(true)
	if m.loading.CompareAndSwap(false, true) {
		go m.loadWhileDirty()
	}
}

// loadWhileDirty loads the map while reloads are asked for (reload), then stops; it holds
// loading, so that no other runs meanwhile.
func (m *slotMap) loadWhileDirty() {
	for {
		for m.dirty.Swap(false) {
			if last := m.lastLoad.Load(); last != 0 {
				time.Sleep(time.Until(time.Unix(0, last).Add(slotMapReloadEvery)))
			}
			m.lastLoad.Store(time.Now().UnixNano())
			m.loadOnce()
		}
		m.loading.Store(false)
		// A reload asked for between the last Swap and the Store above found loading held.
		if !m.dirty.Load() || !m.loading.CompareAndSwap(false, true) {
			return
		}
	}
}

// loadOnce loads the map, within slotMapLoadTimeout, and takes the node clients anew.
func (m *slotMap) loadOnce() {
	ctx, cancel := context.WithTimeout(context.Background(), slotMapLoadTimeout)
	defer cancel()
	started := time.Now()
	if t, err := m.load(ctx); err == nil {
		m.table.Store(t)
		m.loads.Add(1)
	}
	// The connections of the new topology, which the cluster client opens on its own.
	m.nodesSince(started)
}

// load reads CLUSTER SLOTS from the nodes the engine's client knows, in random order, until
// one answers with slots.
func (m *slotMap) load(ctx context.Context) (*slotTable, error) {
	all := m.client.Nodes()
	addrs := make([]string, 0, len(all))
	for addr := range all {
		addrs = append(addrs, addr)
	}
	rand.Shuffle(len(addrs), func(i, j int) { addrs[i], addrs[j] = addrs[j], addrs[i] })
	var errs []error
	for _, addr := range addrs {
		node := all[addr]
		reply, err := node.Do(sendctx.Of(ctx), node.B().ClusterSlots().Build()).ToArray()
		if err == nil {
			var t *slotTable
			if t, err = parseClusterSlots(reply, addr); err == nil && len(t.addrs) > 0 {
				return t, nil
			}
			if err == nil {
				err = errors.New("no primary serves any slot")
			}
		}
		errs = append(errs, fmt.Errorf("CLUSTER SLOTS on %s: %w", addr, err))
		if ctx.Err() != nil {
			break
		}
	}
	if len(errs) == 0 {
		return nil, errors.New("strictrate: load the slot map: the client knows no node")
	}
	return nil, fmt.Errorf("strictrate: load the slot map: %w", errors.Join(errs...))
}

// parseClusterSlots reads a CLUSTER SLOTS reply, asked of the node at from: per range, its
// first and last slot, then its primary (endpoint, port, ...), then its replicas. A primary
// is named as valkey-go names the node (its Nodes() keys): its endpoint and port, the
// endpoint of from when the node does not know its own (""), none when it is unknown ("?").
func parseClusterSlots(ranges []valkey.ValkeyMessage, from string) (*slotTable, error) {
	t := &slotTable{}
	for i := range t.owner {
		t.owner[i] = -1
	}
	index := map[string]int16{}
	for _, r := range ranges {
		fields, err := r.ToArray()
		if err != nil || len(fields) < 3 {
			return nil, fmt.Errorf("a slot range is not [first, last, primary, ...]: %v", r)
		}
		first, err1 := fields[0].AsInt64()
		last, err2 := fields[1].AsInt64()
		primary, err3 := fields[2].ToArray()
		if err := errors.Join(err1, err2, err3); err != nil || len(primary) < 2 || first < 0 || last >= numSlots || first > last {
			return nil, fmt.Errorf("a slot range is not [first, last, primary, ...]: %v (%v)", r, err)
		}
		endpoint, err1 := primary[0].ToString()
		port, err2 := primary[1].AsInt64()
		if err := errors.Join(err1, err2); err != nil {
			return nil, fmt.Errorf("slots %d-%d: the primary's endpoint and port: %w", first, last, err)
		}
		addr := nodeAddr(from, endpoint, port)
		if addr == "" {
			continue
		}
		idx, ok := index[addr]
		if !ok {
			idx = int16(len(t.addrs))
			index[addr] = idx
			t.addrs = append(t.addrs, addr)
		}
		for s := first; s <= last; s++ {
			t.owner[s] = idx
		}
	}
	return t, nil
}

// nodeAddr names a node as valkey-go does: endpoint:port, from's host when endpoint is empty
// (the node does not know its own), "" when it is "?" (unknown).
func nodeAddr(from, endpoint string, port int64) string {
	switch endpoint {
	case "":
		endpoint, _, _ = net.SplitHostPort(from)
	case "?":
		return ""
	}
	return net.JoinHostPort(endpoint, strconv.FormatInt(port, 10))
}

// nodeClient returns a client of the node at addr alone, sharing the engine's client's
// connections to it (so that WAIT and WAITAOF after a call go on the call's connection, as
// ever); nil when the engine's client knows no such node.
func (m *slotMap) nodeClient(addr string) valkey.Client {
	return m.nodesSince(time.Now().Add(-nodeClientsMaxAge)).clients[addr]
}

// nodesSince returns the engine's client's node clients as taken at since or later, taking
// them anew when the ones held are older; one caller takes them, and those arriving meanwhile
// use what it took.
func (m *slotMap) nodesSince(since time.Time) *nodeClients {
	if nc := m.nodes.Load(); nc != nil && !nc.at.Before(since) {
		return nc
	}
	m.nodesMu.Lock()
	defer m.nodesMu.Unlock()
	if nc := m.nodes.Load(); nc != nil && !nc.at.Before(since) {
		return nc
	}
	nc := &nodeClients{at: time.Now(), clients: m.client.Nodes()}
	m.nodes.Store(nc)
	return nc
}
