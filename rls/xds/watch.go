// Package xds receives the rate limit configuration from an xDS management server, as the
// reference server does with CONFIG_TYPE=GRPC_XDS_SOTW and as Envoy Gateway serves it to its
// rate limit deployment.
//
// The protocol is state of the world over the aggregated discovery service
// (envoy.service.discovery.v3.AggregatedDiscoveryService/StreamAggregatedResources), for one
// type, type.googleapis.com/ratelimit.config.ratelimit.v3.RateLimitConfig, with a wildcard
// subscription: every response carries all the RateLimitConfig resources of the node, and
// replaces the previous ones. Each response is acknowledged (ACK: its version and nonce) once
// the caller has applied it, or rejected (NACK: the last accepted version, its nonce and the
// caller's error as error_detail), in which case the caller keeps its last good configuration
// and the server knows why. A server that answers a NACK by sending the same state again, as
// go-control-plane's snapshot cache does, is answered at a slowing pace, not in a tight loop.
//
// Most callers need only Watch and Options; ParseNodeMetadata reads the reference server's
// CONFIG_GRPC_XDS_NODE_METADATA.
package xds

import (
	"context"
	"fmt"
	"math/rand/v2"
	"time"

	rlsconfv3 "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
)

// Watch connects to the xDS server and calls apply with every configuration it sends (all
// RateLimitConfig resources of one response, possibly none). apply's error NACKs the response
// (error_detail), nil ACKs it; apply is called from Watch's goroutine, one response at a time.
// When the connection or the stream fails, Watch reconnects with backoff (Options) until ctx
// ends, and returns ctx's error then. It returns early only for Options that can never work,
// with an error wrapping ErrInvalidOptions.
//
// Every new stream starts from the empty version, so the server sends its whole state and apply
// sees it again after a reconnect: a restarted server whose version counter started over (Envoy
// Gateway's does) is not mistaken for the one before.
func Watch(ctx context.Context, o Options, apply func([]*rlsconfv3.RateLimitConfig) error) error {
	o, err := o.withDefaults()
	if err != nil {
		return err
	}
	if apply == nil {
		return fmt.Errorf("%w: apply is nil", ErrInvalidOptions)
	}
	c, err := newClient(o, apply)
	if err != nil {
		return err
	}
	delay := o.BackoffInitial
	for {
		received, err := c.connect(ctx)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if received {
			delay = o.BackoffInitial
		}
		wait := jittered(delay)
		o.Logger.Warn("xds: no stream to the management server; retrying",
			"server", o.ServerURL, "error", err, "retry_in", wait)
		if err := sleep(ctx, wait); err != nil {
			return err
		}
		delay = min(2*delay, o.BackoffMax)
	}
}

// jittered draws a wait between half and all of d, so that replicas that lost the same server
// at the same moment do not come back in step.
func jittered(d time.Duration) time.Duration {
	half := d / 2
	return half + rand.N(d-half+1)
}
