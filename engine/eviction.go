package engine

import (
	"context"
	"log/slog"
	"strings"

	"github.com/valkey-io/valkey-go"

	"github.com/strictrate/strictrate/internal/nodes"
	"github.com/strictrate/strictrate/internal/sendctx"
)

// checkEviction reads maxmemory-policy on every node and applies the CheckLevel to the
// nodes under an allkeys-* policy (refuseOrWarn: a warning is logged once per node per
// process). A node that refuses CONFIG GET is not checked; a node that cannot be reached fails
// New with ErrUnavailable.
func checkEviction(ctx context.Context, client valkey.Client, check CheckLevel, logger *slog.Logger) error {
	if check == Ignore {
		return nil
	}
	for _, n := range nodes.Sorted(client) {
		kv, err := n.Client.Do(sendctx.Of(ctx), n.Client.B().ConfigGet().Parameter("maxmemory-policy").Build()).AsStrMap()
		if err != nil {
			if _, isServerReply := valkey.IsValkeyErr(err); isServerReply {
				continue // CONFIG is disabled or not permitted here: nothing to check
			}
			return classify(ctx, "strictrate: new engine: CONFIG GET maxmemory-policy on "+n.Addr, err)
		}
		policy := kv["maxmemory-policy"]
		if !strings.HasPrefix(policy, "allkeys-") {
			continue
		}
		if err := refuseOrWarn(check == Refuse, ErrEvictionPolicy, "WithEvictionCheck(Warn)", logger,
			"maxmemory-policy "+policy, []string{n.Addr}, nil, "node %s has maxmemory-policy "+policy+
				": under memory pressure it may evict a limiter key, forgetting admitted events; use noeviction, "+
				"or volatile-* with care"); err != nil {
			return err
		}
	}
	return nil
}
