package main

import (
	"context"
	"fmt"
	"io"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/valkey-io/valkey-go"
)

// The boundary scenario's timing: its first requests start this long before a minute
// boundary, its second ones this long after it.
const (
	boundaryLead  = 900 * time.Millisecond
	boundaryDelay = 100 * time.Millisecond
)

// exactResult is what one server admitted in the exactness scenarios.
type exactResult struct {
	Server string

	// The minute boundary, against 10 a minute: of 10 requests sent in the last second
	// before a minute boundary, Before were admitted, and of 10 sent in the first second
	// after it, After. Span is the time from the first request to the last. Late is set when
	// the first 10 were not all answered before the boundary (the figures then do not show
	// what the scenario is about). BoundaryRan is false when the scenario was skipped.
	BoundaryRan   bool
	Before, After int
	Span          time.Duration
	Late          bool

	// A 1 a minute descriptor already used up, beside a 3 a minute one: of 3 requests that
	// carry both, BothAdmitted were admitted; of 3 requests that carry the 3 a minute one
	// alone afterwards, ThreeLeft were.
	BothAdmitted int
	ThreeLeft    int

	// hits_addend 4, then 4, then 1, against 5 a minute: the answers.
	Addend []pb.RateLimitResponse_Code

	// The token budget scenario (runTokenBudget).
	Tokens tokenResult
}

// runExactness runs the exactness scenarios on each server, on keys of run's own, reading what
// the servers' keys hold through vk. With boundary, it first waits for the wall clock to near
// a minute boundary (up to a minute), and all servers meet the same boundary; the other
// scenarios follow within that minute.
func runExactness(ctx context.Context, servers []*server, vk valkey.Client, run string, boundary bool, progress io.Writer) ([]exactResult, error) {
	results := make([]exactResult, len(servers))
	for i, s := range servers {
		results[i].Server = s.name
	}
	if boundary {
		if err := minuteBoundary(ctx, servers, run, results, progress); err != nil {
			return nil, err
		}
	}
	for i, s := range servers {
		r := &results[i]
		one := descriptor("one_per_minute", run)
		three := descriptor("three_per_minute", run)
		if _, err := decide(ctx, s, 0, one); err != nil {
			return nil, err
		}
		for range 3 {
			code, err := decide(ctx, s, 0, one, three)
			if err != nil {
				return nil, err
			}
			r.BothAdmitted += admitted(code)
		}
		for range 3 {
			code, err := decide(ctx, s, 0, three)
			if err != nil {
				return nil, err
			}
			r.ThreeLeft += admitted(code)
		}
		five := descriptor("five_per_minute", run)
		for _, hits := range []uint32{4, 4, 1} {
			code, err := decide(ctx, s, hits, five)
			if err != nil {
				return nil, err
			}
			r.Addend = append(r.Addend, code)
		}
		tokens, err := runTokenBudget(ctx, s, vk, run)
		if err != nil {
			return nil, err
		}
		r.Tokens = tokens
	}
	return results, nil
}

// minuteBoundary runs the boundary scenario on every server at the same boundary, the next
// one at least boundaryLead plus half a second away.
func minuteBoundary(ctx context.Context, servers []*server, run string, results []exactResult, progress io.Writer) error {
	now := time.Now()
	b := now.Truncate(time.Minute).Add(time.Minute)
	if b.Sub(now) < boundaryLead+500*time.Millisecond {
		b = b.Add(time.Minute)
	}
	fmt.Fprintf(progress, "exactness: waiting %s for the minute boundary at %s\n",
		time.Until(b.Add(-boundaryLead)).Round(time.Second), b.Format("15:04:05"))
	sleepUntil(ctx, b.Add(-boundaryLead))
	if err := ctx.Err(); err != nil {
		return err
	}
	// tenEach sends ten requests of the 10/min descriptor to each server, and counts each
	// one's admissions into *count(i).
	tenEach := func(count func(i int) *int) error {
		for i, s := range servers {
			d := descriptor("ten_per_minute", run)
			for range 10 {
				code, err := decide(ctx, s, 0, d)
				if err != nil {
					return err
				}
				*count(i) += admitted(code)
			}
		}
		return nil
	}
	first := time.Now()
	if err := tenEach(func(i int) *int { return &results[i].Before }); err != nil {
		return err
	}
	late := !time.Now().Before(b)
	sleepUntil(ctx, b.Add(boundaryDelay))
	if err := tenEach(func(i int) *int { return &results[i].After }); err != nil {
		return err
	}
	span := time.Since(first)
	for i := range results {
		results[i].BoundaryRan, results[i].Late, results[i].Span = true, late, span
	}
	return nil
}

// descriptor is the descriptor key=value of the exactness domain.
func descriptor(key, value string) *rlv3.RateLimitDescriptor {
	return &rlv3.RateLimitDescriptor{Entries: []*rlv3.RateLimitDescriptor_Entry{{Key: key, Value: value}}}
}

// decide sends one request of the exactness domain to s, costing hits (0: the proto's
// default, one), and returns its overall code.
func decide(ctx context.Context, s *server, hits uint32, ds ...*rlv3.RateLimitDescriptor) (pb.RateLimitResponse_Code, error) {
	ctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	resp, err := s.clients[0].ShouldRateLimit(ctx, &pb.RateLimitRequest{Domain: exactDomain, Descriptors: ds, HitsAddend: hits})
	if err != nil {
		return 0, fmt.Errorf("bench: exactness on %s: %w", s.name, err)
	}
	return resp.GetOverallCode(), nil
}

// admitted is 1 for OK, else 0.
func admitted(code pb.RateLimitResponse_Code) int {
	if code == pb.RateLimitResponse_OK {
		return 1
	}
	return 0
}
