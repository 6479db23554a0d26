package main

import (
	"context"
	"fmt"
	"strconv"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/valkey-io/valkey-go"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/strictrate/strictrate/inspect"
)

// The token budget scenario: Envoy's two phases against a budget of tokenBudget tokens an
// hour (exact.yaml's tokens rule, with record_over_limit): tokenRequests requests, one after
// the other, each checked with hits_addend 0 and, when admitted, followed by a report of
// tokenCost tokens, what its response used (apply_on_stream_done). Every report is recorded,
// the one that goes over the budget included, so the checks after it are denied.
const (
	tokenBudget   = 1000
	tokenRequests = 6
	tokenCost     = 300
)

// tokenResult is what one server did in the token budget scenario.
type tokenResult struct {
	// Admitted is the checks answered OK; Reported the tokens their reports carried; Counted
	// the tokens the server's keys hold afterwards.
	Admitted int
	Reported int64
	Counted  int64
	// PastBudget is the checks answered OK although the tokens reported before them were
	// already over the budget: requests let through on a spent budget.
	PastBudget int
}

// runTokenBudget runs the token budget scenario on s, on a key of run's own, and reads what
// s's keys hold through vk.
func runTokenBudget(ctx context.Context, s *server, vk valkey.Client, run string) (tokenResult, error) {
	var r tokenResult
	d := descriptor("tokens", run)
	for range tokenRequests {
		code, err := spend(ctx, s, d, 0)
		if err != nil {
			return r, err
		}
		if admitted(code) == 0 {
			continue
		}
		r.Admitted++
		if r.Reported > tokenBudget {
			r.PastBudget++
		}
		if _, err := spend(ctx, s, d, tokenCost); err != nil {
			return r, err
		}
		r.Reported += tokenCost
	}
	var err error
	r.Counted, err = tokensCounted(ctx, s, vk, run)
	return r, err
}

// spend sends d with its own hits_addend, as Envoy sends a rate limit action's (0: a check),
// and returns the overall code.
func spend(ctx context.Context, s *server, d *rlv3.RateLimitDescriptor, hits uint64) (pb.RateLimitResponse_Code, error) {
	return decide(ctx, s, 0, &rlv3.RateLimitDescriptor{Entries: d.Entries, HitsAddend: wrapperspb.UInt64(hits)})
}

// tokensCounted is the tokens s's keys hold for the scenario's descriptor. strictrate-rls
// keeps one log (the engine's prefix, the server's CACHE_KEY_PREFIX, then the descriptor's
// key), read as the strictrate command reads it; the reference keeps a counter per hour
// (its key ends in the hour's start), each of which is added.
func tokensCounted(ctx context.Context, s *server, vk valkey.Client, run string) (int64, error) {
	key := s.prefix + exactDomain + "_tokens_" + run + "_"
	if s.name == nameStrictrate {
		l, err := inspect.Read(ctx, vk, "strictrate:"+key, 1)
		if err != nil {
			return 0, fmt.Errorf("bench: tokens of %s: %w", s.name, err)
		}
		return int64(l.Events), nil
	}
	var total int64
	for cursor := uint64(0); ; {
		entry, err := vk.Do(ctx, vk.B().Scan().Cursor(cursor).Match(key+"*").Count(100).Build()).AsScanEntry()
		if err != nil {
			return 0, fmt.Errorf("bench: tokens of %s: %w", s.name, err)
		}
		for _, k := range entry.Elements {
			v, err := vk.Do(ctx, vk.B().Get().Key(k).Build()).ToString()
			if err != nil {
				return 0, fmt.Errorf("bench: tokens of %s: %s: %w", s.name, k, err)
			}
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				return 0, fmt.Errorf("bench: tokens of %s: %s holds %q", s.name, k, v)
			}
			total += n
		}
		if cursor = entry.Cursor; cursor == 0 {
			return total, nil
		}
	}
}
