package engine

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"

	"github.com/valkey-io/valkey-go"

	"github.com/strictrate/strictrate/internal/nodes"
	"github.com/strictrate/strictrate/internal/sendctx"
)

// checkPersistence reads INFO persistence and replication on every node. A primary with
// neither an append-only file nor a connected replica keeps the logs only in memory: check
// says whether New fails (ErrPersistence), logs one warning naming such nodes (once per node
// per process: refuseOrWarn), or says nothing. needAOF (WithDurableAck with a local fsync) fails New with ErrPersistence for any
// primary without an append-only file, or that never fsyncs it (appendfsync no), whatever check
// says; a primary under appendfsync everysec, whose WAITAOF may answer before the fsync
// (checkDurable), is treated as check says. A node that refuses INFO is not checked; a node
// that cannot be reached fails New with ErrUnavailable.
func checkPersistence(ctx context.Context, client valkey.Client, check CheckLevel, needAOF bool, logger *slog.Logger) error {
	if check == Ignore && !needAOF {
		return nil
	}
	var inMemory, weakAck []string
	runIDs := map[string]string{}
	for _, n := range nodes.Sorted(client) {
		text, err := n.Client.Do(sendctx.Of(ctx), n.Client.B().Info().Section("persistence", "replication", "server").Build()).ToString()
		if err != nil {
			if _, isServerReply := valkey.IsValkeyErr(err); isServerReply {
				continue // INFO is disabled or not permitted here: nothing to check
			}
			return classify(ctx, "strictrate: new engine: INFO persistence on "+n.Addr, err)
		}
		if infoField(text, "role") != "master" {
			continue // a replica takes no decisions
		}
		runIDs[n.Addr] = infoField(text, "run_id")
		aof := infoField(text, "aof_enabled") == "1"
		if needAOF {
			weak, err := checkDurable(ctx, n.Addr, n.Client, aof)
			if err != nil {
				return err
			}
			if weak {
				weakAck = append(weakAck, n.Addr)
			}
		}
		if !aof && infoField(text, "connected_slaves") == "0" {
			inMemory = append(inMemory, n.Addr)
		}
	}
	if check == Ignore {
		return nil
	}
	// report refuses (Refuse) or warns (Warn) about the nodes named.
	report := func(finding string, nodes []string, format string) error {
		return refuseOrWarn(check == Refuse, ErrPersistence, "WithPersistenceCheck(Warn)", logger,
			finding, nodes, runIDs, format)
	}
	if err := report("appendfsync everysec", weakAck, "node %s runs appendfsync everysec, under which WAITAOF may acknowledge an admission "+
		"before its fsync (Valkey 8.0 answers it on its cron tick; measured with a simulated power loss), so "+
		"WithDurableAck's yes can still be lost to a power loss: run appendfsync always"); err != nil {
		return err
	}
	return report("logs in memory only", inMemory, "node %s keeps counts in memory only (appendonly no, no replica): "+
		"a restart forgets them; set appendonly yes, or WithPersistenceCheck(engine.Ignore) to silence this")
}

// checkDurable returns ErrPersistence unless the primary at addr can fsync an admission before
// its WAITAOF acknowledges it: appendonly yes, and appendfsync other than no (under no it never
// fsyncs, and every WAITAOF would time out). It reports weak under appendfsync everysec: Valkey
// (8.0.1 measured, TestPowerLossSimulated) answers WAITAOF on its cron tick whether or not the
// fsync ran, so an acknowledged admission can still be lost to a power loss; only always makes
// the acknowledgement a disk write. A node that refuses CONFIG GET is taken at its INFO's word.
func checkDurable(ctx context.Context, addr string, node valkey.Client, aof bool) (weak bool, err error) {
	const advice = "WithDurableAck with a local fsync needs appendonly yes, and appendfsync always to be sure " +
		"(or ask only replicas: WithDurableAck(0, n, timeout))"
	if !aof {
		return false, fmt.Errorf("%w: node %s runs appendonly no; %s", ErrPersistence, addr, advice)
	}
	kv, err := node.Do(sendctx.Of(ctx), node.B().ConfigGet().Parameter("appendfsync").Build()).AsStrMap()
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

// warnedNodes remembers, for the process, which findings about which nodes refuseOrWarn has
// logged (the finding, the node's address and, where known, its run_id, which a server makes
// anew each time it starts): a program that makes many engines (a benchmark, a test, one
// engine per tenant) hears each warning once per node, not once per New, and a new server on
// an address another one had is a node of its own. It is the engine package's only
// process-wide state, for that one purpose.
var warnedNodes sync.Map

// refuseOrWarn applies a start-up check's verdict to the nodes it found something about.
// refuse: an error wrapping sentinel that names them all and says how to only warn (hint).
// Otherwise it logs one warning through logger (nil: none) naming the nodes not yet warned
// about for finding in this process (runIDs gives a node's run_id by address, where known),
// and returns nil. format takes the nodes, comma-separated.
func refuseOrWarn(refuse bool, sentinel error, hint string, logger *slog.Logger, finding string, nodes []string, runIDs map[string]string, format string) error {
	if len(nodes) == 0 {
		return nil
	}
	if refuse {
		return fmt.Errorf("%w: %s (%s to only warn)", sentinel, fmt.Sprintf(format, strings.Join(nodes, ", ")), hint)
	}
	var fresh []string
	for _, addr := range nodes {
		if _, seen := warnedNodes.LoadOrStore(finding+"\x00"+addr+"\x00"+runIDs[addr], true); !seen {
			fresh = append(fresh, addr)
		}
	}
	if len(fresh) > 0 && logger != nil {
		logger.Warn("strictrate: "+fmt.Sprintf(format, strings.Join(fresh, ", ")), slog.String("finding", finding),
			slog.Any("nodes", fresh))
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
