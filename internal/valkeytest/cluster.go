package valkeytest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/valkey-io/valkey-go"
)

// Cluster is a real Valkey Cluster of valkey-server processes on loopback, for tests.
type Cluster struct {
	// Primaries are the nodes that own the slots, in slot order; Replicas[i] replicates
	// Primaries[i] (nil where replicasPerPrimary is 0).
	Primaries []*Node
	Replicas  []*Node
	dir       string
}

// Node is one server of a Cluster.
type Node struct {
	// Addr is the node's client address, host:port.
	Addr string
	// ID is the node's cluster id.
	ID string
	// Slots is the slot range [First, Last] the node owned when the cluster started.
	First, Last int

	bus    string // the cluster bus port
	proc   *process
	client valkey.Client // to this node alone; closed by Cluster.Close
}

// NodeTimeout is the cluster-node-timeout of the clusters StartCluster builds: short, so that a
// failover completes in a few seconds.
const NodeTimeout = time.Second

// StartCluster starts primaries primary nodes, each with replicasPerPrimary replicas, assigns
// the 16384 slots evenly, and returns once every node reports cluster_state:ok and every
// replica's link is up. It needs valkey-server (or redis-server 7+) on PATH. The caller must
// Close it.
func StartCluster(ctx context.Context, primaries, replicasPerPrimary int) (*Cluster, error) {
	bin := FindBinary()
	if bin == "" {
		return nil, fmt.Errorf("valkeytest: a cluster needs valkey-server on PATH: %w", ErrNoServer)
	}
	if primaries < 1 || replicasPerPrimary < 0 {
		return nil, errors.New("valkeytest: a cluster needs at least one primary")
	}
	dir, err := os.MkdirTemp("", "strictrate-cluster-")
	if err != nil {
		return nil, err
	}
	c := &Cluster{dir: dir}
	ok := false
	defer func() {
		if !ok {
			_ = c.Close()
		}
	}()

	total := primaries * (1 + replicasPerPrimary)
	var nodes []*Node
	for i := 0; i < total; i++ {
		n, err := startNode(ctx, bin, filepath.Join(dir, "node"+strconv.Itoa(i)))
		if err != nil {
			return nil, err
		}
		nodes = append(nodes, n)
		if i < primaries {
			c.Primaries = append(c.Primaries, n)
		} else {
			c.Replicas = append(c.Replicas, n)
		}
	}
	for _, n := range nodes {
		cl := n.client
		if n.ID, err = cl.Do(ctx, cl.B().ClusterMyid().Build()).ToString(); err != nil {
			return nil, fmt.Errorf("valkeytest: CLUSTER MYID on %s: %w", n.Addr, err)
		}
	}
	per := 16384 / primaries
	for i, p := range c.Primaries {
		p.First, p.Last = i*per, (i+1)*per-1
		if i == primaries-1 {
			p.Last = 16383
		}
		cl := p.client
		add := cl.B().ClusterAddslotsrange().StartSlotEndSlot().StartSlotEndSlot(int64(p.First), int64(p.Last)).Build()
		if err := cl.Do(ctx, add).Error(); err != nil {
			return nil, fmt.Errorf("valkeytest: CLUSTER ADDSLOTSRANGE on %s: %w", p.Addr, err)
		}
	}
	host, portText, _ := net.SplitHostPort(nodes[0].Addr)
	port, _ := strconv.ParseInt(portText, 10, 64)
	bus, _ := strconv.ParseInt(nodes[0].bus, 10, 64)
	for _, n := range nodes[1:] {
		cl := n.client
		if err := cl.Do(ctx, cl.B().ClusterMeet().Ip(host).Port(port).ClusterBusPort(bus).Build()).Error(); err != nil {
			return nil, fmt.Errorf("valkeytest: CLUSTER MEET on %s: %w", n.Addr, err)
		}
	}
	if err := WaitFor(ctx, 30*time.Second, "every node to know every other", func() (bool, error) {
		for _, n := range nodes {
			cl := n.client
			out, err := cl.Do(ctx, cl.B().ClusterNodes().Build()).ToString()
			if err != nil {
				return false, err
			}
			if strings.Count(strings.TrimSpace(out), "\n")+1 != total || strings.Contains(out, "handshake") {
				return false, nil
			}
		}
		return true, nil
	}); err != nil {
		return nil, err
	}
	for i, r := range c.Replicas {
		p := c.Primaries[i%primaries]
		r.First, r.Last = p.First, p.Last
		if err := r.client.Do(ctx, r.client.B().ClusterReplicate().NodeId(p.ID).Build()).Error(); err != nil {
			return nil, fmt.Errorf("valkeytest: CLUSTER REPLICATE on %s: %w", r.Addr, err)
		}
	}
	if err := c.WaitHealthy(ctx); err != nil {
		return nil, err
	}
	if err := c.waitShardsOnline(ctx); err != nil {
		return nil, err
	}
	ok = true
	return c, nil
}

// waitShardsOnline waits until every node's CLUSTER SHARDS calls every node "online". A replica
// reports "loading" until its replication offset moves, and clients leave such replicas out,
// so a write on each primary starts the offsets first.
func (c *Cluster) waitShardsOnline(ctx context.Context) error {
	for _, p := range c.Primaries {
		if err := p.client.Do(ctx, p.client.B().Incr().Key(p.ownedKey("valkeytest:warmup:")).Build()).Error(); err != nil {
			return fmt.Errorf("valkeytest: warm-up write on %s: %w", p.Addr, err)
		}
	}
	return WaitFor(ctx, 30*time.Second, "every node to be online in CLUSTER SHARDS", func() (bool, error) {
		for _, n := range c.Nodes() {
			cl := n.client
			shards, err := cl.Do(ctx, cl.B().ClusterShards().Build()).ToArray()
			if err != nil {
				return false, nil
			}
			online := 0
			for _, shard := range shards {
				m, _ := shard.AsMap()
				list := m["nodes"]
				nodes, _ := list.ToArray()
				for _, node := range nodes {
					nm, _ := node.AsMap()
					health := nm["health"]
					if h, _ := health.ToString(); h == "online" {
						online++
					}
				}
			}
			if online != len(c.Nodes()) {
				return false, nil
			}
		}
		return true, nil
	})
}

// KeySlot returns the cluster slot (0 to 16383) of key, computed here as CLUSTER KEYSLOT
// would answer it: the CRC16 of the key, or of its hash tag, by valkey-go's own routing code.
func KeySlot(key string) int {
	cmd := valkey.Completed{}.SetSlot(key)
	return int(cmd.Slot())
}

// Owns reports whether key's slot is in the node's range [First, Last].
func (n *Node) Owns(key string) bool {
	slot := KeySlot(key)
	return slot >= n.First && slot <= n.Last
}

// ownedKey returns prefix followed by the first number (0, 1, 2 ...) that makes a key the node owns.
func (n *Node) ownedKey(prefix string) string {
	for i := 0; ; i++ {
		if key := prefix + strconv.Itoa(i); n.Owns(key) {
			return key
		}
	}
}

// NewCluster starts a cluster for a test and stops it in tb's cleanup.
func NewCluster(tb testing.TB, primaries, replicasPerPrimary int) *Cluster {
	tb.Helper()
	return forTest(tb, "cluster", func(ctx context.Context) (*Cluster, error) {
		return StartCluster(ctx, primaries, replicasPerPrimary)
	})
}

func startNode(ctx context.Context, bin, dir string) (*Node, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	var lastErr error
	for attempt := 0; attempt < 5; attempt++ {
		ports, err := FreePorts(2)
		if err != nil {
			return nil, err
		}
		port, bus := ports[0], ports[1]
		p := &process{bin: bin, dir: dir, port: port, extra: []string{
			"--cluster-enabled", "yes",
			"--cluster-config-file", filepath.Join(dir, "nodes.conf"),
			"--cluster-port", bus,
			"--cluster-node-timeout", strconv.Itoa(int(NodeTimeout / time.Millisecond)),
			// A replica whose link broke just before its primary died may still take over:
			// the failover tests need exactly that.
			"--cluster-replica-validity-factor", "0",
		}}
		if lastErr = p.start(ctx); lastErr == nil {
			n := &Node{Addr: p.addr(), bus: bus, proc: p}
			// No retry: the harness's waits poll, and a dead node should answer at once.
			if n.client, lastErr = dial(n.Addr, valkey.ClientOption{DisableRetry: true, DisableCache: true}); lastErr == nil {
				return n, nil
			}
			p.kill()
		}
		_ = os.Remove(filepath.Join(dir, "nodes.conf"))
	}
	return nil, fmt.Errorf("valkeytest: start cluster node: %w", lastErr)
}

// Addrs returns every node's address: what a cluster client's InitAddress takes.
func (c *Cluster) Addrs() []string {
	var addrs []string
	for _, n := range c.Nodes() {
		addrs = append(addrs, n.Addr)
	}
	return addrs
}

// Nodes returns every node, primaries first.
func (c *Cluster) Nodes() []*Node { return append(append([]*Node{}, c.Primaries...), c.Replicas...) }

// Client returns a cluster client for the whole cluster, closed in tb's cleanup. Options set
// everything but InitAddress, which lists the primaries: the client finds the replicas itself.
// (valkey-go keeps the plain connection it opened to a replica listed in InitAddress, which
// then answers reads with MOVED even under SendToReplicas.)
func (c *Cluster) Client(tb testing.TB, opt valkey.ClientOption) valkey.Client {
	tb.Helper()
	for _, p := range c.Primaries {
		opt.InitAddress = append(opt.InitAddress, p.Addr)
	}
	client, err := valkey.NewClient(opt)
	if err != nil {
		tb.Fatalf("valkeytest: connect to cluster: %v", err)
	}
	tb.Cleanup(client.Close)
	return client
}

// Close stops every node and removes the cluster's files.
func (c *Cluster) Close() error {
	for _, n := range c.Nodes() {
		if n.client != nil {
			n.client.Close()
		}
		if n.proc != nil {
			n.proc.kill()
		}
	}
	return os.RemoveAll(c.dir)
}

// Crash kills the node at once (SIGKILL), as a machine failure would.
func (n *Node) Crash() { n.proc.crash() }

// Alive reports whether the node's process is still running.
func (n *Node) Alive() bool {
	return !n.proc.run.exited()
}

// Client returns the node's own client: connected to this node alone and never redirected to
// another (a command for a key of other slots gets the MOVED error), logged in as the default
// user, without retries. The Cluster closes it; callers must not. For READONLY before a read
// on a replica, send both with DoMulti: they then go on one connection, in order.
func (n *Node) Client() valkey.Client { return n.client }

// Role returns "master" or "slave" as the node's INFO replication says.
func (n *Node) Role(ctx context.Context) (string, error) {
	info, err := ReadInfo(ctx, n.client, "replication")
	if err != nil {
		return "", err
	}
	return info["role"], nil
}

// clusterInfo reads the node's CLUSTER INFO.
func (n *Node) clusterInfo(ctx context.Context) (Info, error) {
	text, err := n.client.Do(ctx, n.client.B().ClusterInfo().Build()).ToString()
	if err != nil {
		return nil, err
	}
	return ParseInfo(text), nil
}

// WaitHealthy waits until every live node reports cluster_state:ok, every slot is served by a
// live primary, and every live replica's link to its primary is up.
func (c *Cluster) WaitHealthy(ctx context.Context) error {
	return WaitFor(ctx, 60*time.Second, "the cluster to be healthy", func() (bool, error) {
		for _, n := range c.Nodes() {
			if !n.Alive() {
				continue
			}
			info, err := n.clusterInfo(ctx)
			if err != nil || info["cluster_state"] != "ok" {
				return false, nil
			}
			repl, err := ReadInfo(ctx, n.client, "replication")
			if err != nil || repl["role"] == "slave" && repl["master_link_status"] != "up" {
				return false, nil
			}
		}
		return true, nil
	})
}

// WaitPromoted waits until a live node other than old serves old's slots as a primary, and
// returns it: the replica that took over after old failed.
func (c *Cluster) WaitPromoted(ctx context.Context, old *Node) (*Node, error) {
	var promoted *Node
	err := WaitFor(ctx, 60*time.Second, "a replica of "+old.Addr+" to be promoted", func() (bool, error) {
		for _, n := range c.Nodes() {
			if n == old || !n.Alive() || n.First != old.First {
				continue
			}
			if role, err := n.Role(ctx); err == nil && role == "master" {
				info, err := n.clusterInfo(ctx)
				if err == nil && info["cluster_state"] == "ok" {
					promoted = n
					return true, nil
				}
			}
		}
		return false, nil
	})
	return promoted, err
}
