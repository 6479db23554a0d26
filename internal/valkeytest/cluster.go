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

	bus  string // the cluster bus port
	proc *process
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
		if n.ID, err = command(ctx, n.Addr, "CLUSTER", "MYID"); err != nil {
			return nil, err
		}
	}
	per := 16384 / primaries
	for i, p := range c.Primaries {
		p.First, p.Last = i*per, (i+1)*per-1
		if i == primaries-1 {
			p.Last = 16383
		}
		if _, err := command(ctx, p.Addr, "CLUSTER", "ADDSLOTSRANGE", strconv.Itoa(p.First), strconv.Itoa(p.Last)); err != nil {
			return nil, err
		}
	}
	host, port, _ := net.SplitHostPort(nodes[0].Addr)
	for _, n := range nodes[1:] {
		if _, err := command(ctx, n.Addr, "CLUSTER", "MEET", host, port, nodes[0].bus); err != nil {
			return nil, err
		}
	}
	if err := waitFor(ctx, 30*time.Second, "every node to know every other", func() (bool, error) {
		for _, n := range nodes {
			out, err := command(ctx, n.Addr, "CLUSTER", "NODES")
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
		r.First, r.Last = c.Primaries[i%primaries].First, c.Primaries[i%primaries].Last
		if _, err := command(ctx, r.Addr, "CLUSTER", "REPLICATE", c.Primaries[i%primaries].ID); err != nil {
			return nil, err
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
		if _, err := command(ctx, p.Addr, "INCR", fmt.Sprintf("valkeytest:warmup{%s}", slotTag(p))); err != nil {
			return err
		}
	}
	var clients []valkey.Client
	defer func() {
		for _, cl := range clients {
			cl.Close()
		}
	}()
	for _, n := range c.Nodes() {
		cl, err := valkey.NewClient(valkey.ClientOption{InitAddress: []string{n.Addr}, ForceSingleClient: true})
		if err != nil {
			return err
		}
		clients = append(clients, cl)
	}
	return waitFor(ctx, 30*time.Second, "every node to be online in CLUSTER SHARDS", func() (bool, error) {
		for _, cl := range clients {
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

// slotTag returns a hash tag whose slot the primary owns, found by asking it.
func slotTag(p *Node) string {
	for i := 0; ; i++ {
		tag := strconv.Itoa(i)
		out, err := command(context.Background(), p.Addr, "CLUSTER", "KEYSLOT", tag)
		if err != nil {
			return tag
		}
		if slot, _ := strconv.Atoi(out); slot >= p.First && slot <= p.Last {
			return tag
		}
	}
}

// NewCluster starts a cluster for a test and stops it in tb's cleanup.
func NewCluster(tb testing.TB, primaries, replicasPerPrimary int) *Cluster {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, err := StartCluster(ctx, primaries, replicasPerPrimary)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		if err := c.Close(); err != nil {
			tb.Errorf("valkeytest: stop cluster: %v", err)
		}
	})
	return c
}

func startNode(ctx context.Context, bin, dir string) (*Node, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	var lastErr error
	for attempt := 0; attempt < 5; attempt++ {
		port, err := freePort()
		if err != nil {
			return nil, err
		}
		bus, err := freePort()
		if err != nil {
			return nil, err
		}
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
			return &Node{Addr: p.addr(), bus: bus, proc: p}, nil
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
	select {
	case <-n.proc.done:
		return false
	default:
		return true
	}
}

// Command sends one command to the node on a fresh connection and returns the reply as text
// (status, integer or bulk string).
func (n *Node) Command(ctx context.Context, args ...string) (string, error) {
	return command(ctx, n.Addr, args...)
}

// Commands sends several commands to the node on one connection and returns the last reply:
// for AUTH or READONLY before the command that needs them.
func (n *Node) Commands(ctx context.Context, cmds ...[]string) (string, error) {
	return commands(ctx, n.Addr, cmds...)
}

// Role returns "master" or "slave" as the node's INFO replication says.
func (n *Node) Role(ctx context.Context) (string, error) {
	info, err := command(ctx, n.Addr, "INFO", "replication")
	if err != nil {
		return "", err
	}
	return infoField(info, "role"), nil
}

// WaitHealthy waits until every live node reports cluster_state:ok, every slot is served by a
// live primary, and every live replica's link to its primary is up.
func (c *Cluster) WaitHealthy(ctx context.Context) error {
	return waitFor(ctx, 60*time.Second, "the cluster to be healthy", func() (bool, error) {
		for _, n := range c.Nodes() {
			if !n.Alive() {
				continue
			}
			info, err := command(ctx, n.Addr, "CLUSTER", "INFO")
			if err != nil {
				return false, nil
			}
			if infoField(info, "cluster_state") != "ok" {
				return false, nil
			}
			repl, err := command(ctx, n.Addr, "INFO", "replication")
			if err != nil {
				return false, nil
			}
			if infoField(repl, "role") == "slave" && infoField(repl, "master_link_status") != "up" {
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
	err := waitFor(ctx, 60*time.Second, "a replica of "+old.Addr+" to be promoted", func() (bool, error) {
		for _, n := range c.Nodes() {
			if n == old || !n.Alive() || n.First != old.First {
				continue
			}
			if role, err := n.Role(ctx); err == nil && role == "master" {
				info, err := command(ctx, n.Addr, "CLUSTER", "INFO")
				if err == nil && infoField(info, "cluster_state") == "ok" {
					promoted = n
					return true, nil
				}
			}
		}
		return false, nil
	})
	return promoted, err
}

// waitFor polls cond every 50ms until it holds, it fails, ctx ends or limit passes.
func waitFor(ctx context.Context, limit time.Duration, what string, cond func() (bool, error)) error {
	deadline := time.Now().Add(limit)
	for {
		done, err := cond()
		if err != nil {
			return fmt.Errorf("valkeytest: waiting for %s: %w", what, err)
		}
		if done {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("valkeytest: %s did not happen within %s", what, limit)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("valkeytest: waiting for %s: %w", what, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}
