package engine

import (
	"context"
	"fmt"
	"log/slog"
	"sort"
	"strings"

	"github.com/valkey-io/valkey-go"
)

// checkPersistence reads INFO persistence and replication on every node. A primary with
// neither an append-only file nor a connected replica keeps the logs only in memory: check
// says whether New fails (ErrPersistence), logs one warning naming every such node, or says
// nothing. needAOF (WithDurableAck with a local fsync) fails New with ErrPersistence for any
// primary without an append-only file, or that never fsyncs it (appendfsync no), whatever check
// says; a primary under appendfsync everysec, whose WAITAOF may answer before the fsync
// (checkDurable), is treated as check says. A node that refuses INFO is not checked; a node
// that cannot be reached fails New with ErrUnavailable.
func checkPersistence(ctx context.Context, client valkey.Client, check PersistenceCheck, needAOF bool, logger *slog.Logger) error {
	if check == PersistenceIgnore && !needAOF {
		return nil
	}
	var inMemory, weakAck []string
	err := eachNode(client, func(addr string, node valkey.Client) error {
		text, err := node.Do(ctx, node.B().Info().Section("persistence", "replication").Build()).ToString()
		if err != nil {
			if _, isServerReply := valkey.IsValkeyErr(err); isServerReply {
				return nil // INFO is disabled or not permitted here: nothing to check
			}
			return classify(ctx, "strictrate: new engine: INFO persistence on "+addr, err)
		}
		if infoField(text, "role") != "master" {
			return nil // a replica takes no decisions
		}
		aof := infoField(text, "aof_enabled") == "1"
		if needAOF {
			weak, err := checkDurable(ctx, addr, node, aof)
			if err != nil {
				return err
			}
			if weak {
				weakAck = append(weakAck, addr)
			}
		}
		if !aof && infoField(text, "connected_slaves") == "0" {
			inMemory = append(inMemory, addr)
		}
		return nil
	})
	if err != nil || check == PersistenceIgnore {
		return err
	}
	// report refuses (PersistenceRefuse) or warns (PersistenceWarn) about the nodes named.
	report := func(nodes []string, format string) error {
		if len(nodes) == 0 {
			return nil
		}
		msg := fmt.Sprintf(format, strings.Join(nodes, ", "))
		if check == PersistenceRefuse {
			return fmt.Errorf("%w: %s (WithPersistenceCheck(PersistenceWarn) to only warn)", ErrPersistence, msg)
		}
		if logger != nil {
			logger.Warn("strictrate: " + msg)
		}
		return nil
	}
	if err := report(weakAck, "node %s runs appendfsync everysec, under which WAITAOF may acknowledge an admission "+
		"before its fsync (Valkey 8.0 answers it on its cron tick; measured with a simulated power loss), so "+
		"WithDurableAck's yes can still be lost to a power loss: run appendfsync always"); err != nil {
		return err
	}
	return report(inMemory, "node %s keeps the limiter logs only in memory (appendonly no, no replica): a restart "+
		"forgets every admitted event of every window, and each key can admit up to its Max again at once; "+
		"run appendonly yes (a crash then forgets nothing; a power loss up to about a second under appendfsync everysec, "+
		"nothing under always or WithDurableAck), or attach a replica")
}

// checkDurable returns ErrPersistence unless the primary at addr can fsync an admission before
// its WAITAOF acknowledges it: appendonly yes, and appendfsync other than no (under no it never
// fsyncs, and every WAITAOF would time out). It reports weak under appendfsync everysec: Valkey
// (8.0.1 measured, TestPowerLossSimulated) answers WAITAOF on its cron tick whether or not the
// fsync ran, so an admission told yes can still be lost to a power loss; only always makes the
// acknowledgement a disk write. A node that refuses CONFIG GET is taken at its INFO's word.
func checkDurable(ctx context.Context, addr string, node valkey.Client, aof bool) (weak bool, err error) {
	const advice = "WithDurableAck with a local fsync needs appendonly yes, and appendfsync always to be sure " +
		"(or ask only replicas: WithDurableAck(0, n, timeout))"
	if !aof {
		return false, fmt.Errorf("%w: node %s runs appendonly no; %s", ErrPersistence, addr, advice)
	}
	kv, err := node.Do(ctx, node.B().ConfigGet().Parameter("appendfsync").Build()).AsStrMap()
	if err != nil {
		if _, isServerReply := valkey.IsValkeyErr(err); isServerReply {
			return false, nil // CONFIG is disabled or not permitted here: nothing more to check
		}
		return false, classify(ctx, "strictrate: new engine: CONFIG GET appendfsync on "+addr, err)
	}
	switch fsync := kv["appendfsync"]; fsync {
	case "always":
		return false, nil
	case "no":
		return false, fmt.Errorf("%w: node %s runs appendfsync no, under which it never fsyncs and WAITAOF "+
			"never acknowledges; %s", ErrPersistence, addr, advice)
	default:
		return true, nil
	}
}

// eachNode calls fn for every node the client knows, in the order of their addresses (so the
// first failure reported is the same on every run), and stops at its first error.
func eachNode(client valkey.Client, fn func(addr string, node valkey.Client) error) error {
	nodes := client.Nodes()
	addrs := make([]string, 0, len(nodes))
	for addr := range nodes {
		addrs = append(addrs, addr)
	}
	sort.Strings(addrs)
	for _, addr := range addrs {
		if err := fn(addr, nodes[addr]); err != nil {
			return err
		}
	}
	return nil
}

// infoField returns the value of field name in the text of an INFO reply ("name:value" lines),
// or "" when it is absent.
func infoField(text, name string) string {
	for line := range strings.Lines(text) {
		if value, ok := strings.CutPrefix(strings.TrimRight(line, "\r\n"), name+":"); ok {
			return value
		}
	}
	return ""
}
