package engine

import (
	"context"
	"fmt"
	"log/slog"
	"strings"

	"github.com/valkey-io/valkey-go"
)

// checkEviction reads maxmemory-policy on every node and applies the EvictionCheck to any
// allkeys-* policy. A node that refuses CONFIG GET is not checked; a node that cannot be
// reached fails New with ErrUnavailable.
func checkEviction(ctx context.Context, client valkey.Client, check EvictionCheck, logger *slog.Logger) error {
	if check == EvictionIgnore {
		return nil
	}
	return eachNode(client, func(addr string, node valkey.Client) error {
		kv, err := node.Do(ctx, node.B().ConfigGet().Parameter("maxmemory-policy").Build()).AsStrMap()
		if err != nil {
			if _, isServerReply := valkey.IsValkeyErr(err); isServerReply {
				return nil // CONFIG is disabled or not permitted here: nothing to check
			}
			return classify(ctx, "strictrate: new engine: CONFIG GET maxmemory-policy on "+addr, err)
		}
		policy := kv["maxmemory-policy"]
		if !strings.HasPrefix(policy, "allkeys-") {
			return nil
		}
		msg := fmt.Sprintf("node %s has maxmemory-policy %s: under memory pressure it may evict a limiter key, "+
			"forgetting admitted events; use noeviction, or volatile-* with care", addr, policy)
		if check == EvictionWarn {
			if logger != nil {
				logger.Warn("strictrate: " + msg)
			}
			return nil
		}
		return fmt.Errorf("%w: %s (WithEvictionCheck(EvictionWarn) to only warn)", ErrEvictionPolicy, msg)
	})
}
