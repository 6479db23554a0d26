package xds

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"runtime/debug"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	rlsconfv3 "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	rpcstatus "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/structpb"
)

// TypeURL is the resource type the rate limit configuration travels as.
const TypeURL = "type.googleapis.com/ratelimit.config.ratelimit.v3.RateLimitConfig"

// userAgentName is the node's user_agent_name, which management servers log.
const userAgentName = "strictrate-rls"

// client holds what every stream of one Watch shares.
type client struct {
	o           Options
	node        *corev3.Node
	dialOptions []grpc.DialOption
	apply       func([]*rlsconfv3.RateLimitConfig) error
}

func newClient(o Options, apply func([]*rlsconfv3.RateLimitConfig) error) (*client, error) {
	fields := make(map[string]*structpb.Value, len(o.NodeMetadata))
	for k, v := range o.NodeMetadata {
		fields[k] = structpb.NewStringValue(v)
	}
	node := &corev3.Node{
		Id:            o.NodeID,
		Metadata:      &structpb.Struct{Fields: fields},
		UserAgentName: userAgentName,
	}
	if v := moduleVersion(); v != "" {
		node.UserAgentVersionType = &corev3.Node_UserAgentVersion{UserAgentVersion: v}
	}

	creds := insecure.NewCredentials()
	if o.TLS != nil {
		creds = credentials.NewTLS(o.TLS)
	}
	dialOptions := []grpc.DialOption{
		grpc.WithTransportCredentials(creds),
		grpc.WithUserAgent(userAgentName),
	}
	if o.MaxRecvMsgSize > 0 {
		dialOptions = append(dialOptions, grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(o.MaxRecvMsgSize)))
	}
	// Fail now on a target gRPC cannot even parse: retrying would not mend it.
	conn, err := grpc.NewClient(o.ServerURL, dialOptions...)
	if err != nil {
		return nil, fmt.Errorf("%w: management server %q: %w", ErrInvalidOptions, o.ServerURL, err)
	}
	_ = conn.Close()
	return &client{o: o, node: node, dialOptions: dialOptions, apply: apply}, nil
}

// connect opens a connection and one stream on it, and serves that stream until it fails or
// ctx ends. received reports whether the server answered at all, which resets the backoff.
// Each attempt gets a new connection: one kept across attempts would retry on gRPC's own
// backoff, which grows to two minutes, rather than on ours.
func (c *client) connect(ctx context.Context) (received bool, err error) {
	conn, err := grpc.NewClient(c.o.ServerURL, c.dialOptions...)
	if err != nil {
		return false, fmt.Errorf("xds: connecting to %s: %w", c.o.ServerURL, err)
	}
	defer conn.Close()

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	if len(c.o.Headers) > 0 {
		ctx = metadata.NewOutgoingContext(ctx, metadata.New(c.o.Headers))
	}
	stream, err := discoveryv3.NewAggregatedDiscoveryServiceClient(conn).StreamAggregatedResources(ctx)
	if err != nil {
		return false, fmt.Errorf("xds: opening a stream to %s: %w", c.o.ServerURL, err)
	}
	return c.serve(stream)
}

// serve subscribes on stream and answers each response with an ACK or a NACK.
func (c *client) serve(stream discoveryv3.AggregatedDiscoveryService_StreamAggregatedResourcesClient) (received bool, err error) {
	// accepted is the version last ACKed on this stream, which a NACK repeats.
	accepted := ""
	// rejected is the response last NACKed on this stream, while nothing newer was accepted.
	var rejected *rejection
	if err := c.send(stream, accepted, "", nil); err != nil {
		return false, err
	}
	for {
		resp, err := stream.Recv()
		if err != nil {
			return received, fmt.Errorf("xds: receiving from %s: %w", c.o.ServerURL, err)
		}
		if !received {
			c.o.Logger.Info("xds: connected to the management server", "server", c.o.ServerURL, "node", c.o.NodeID)
			received = true
		}
		if resp.GetTypeUrl() != TypeURL {
			// Only one type is subscribed; answering for another would subscribe to it.
			c.o.Logger.Warn("xds: ignoring a response of a type not subscribed to",
				"type", resp.GetTypeUrl(), "version", resp.GetVersionInfo())
			continue
		}
		if rejected.repeatedBy(resp) {
			// go-control-plane's snapshot cache, which Envoy Gateway serves from, answers a
			// NACK by sending the rejected state again at once, until the state changes: the
			// same answer is paced rather than recomputed and sent back at once, so that the
			// two sides do not spin. The pace bounds how late the next state arrives.
			c.o.Logger.Debug("xds: the management server resent the configuration rejected",
				"version", resp.GetVersionInfo(), "nack_in", rejected.pace)
			if err := sleep(stream.Context(), rejected.pace); err != nil {
				return received, err
			}
			rejected.pace = min(2*rejected.pace, maxRepeatNACKPace)
			if err := c.send(stream, accepted, resp.GetNonce(), rejected.detail); err != nil {
				return received, err
			}
			continue
		}
		configs, err := decode(resp)
		if err == nil {
			err = c.apply(configs)
		}
		if err != nil {
			c.o.Logger.Error("xds: configuration rejected; keeping the last one applied",
				"version", resp.GetVersionInfo(), "error", err)
			rejected = newRejection(resp, err)
			if err := c.send(stream, accepted, resp.GetNonce(), rejected.detail); err != nil {
				return received, err
			}
			continue
		}
		rejected = nil
		accepted = resp.GetVersionInfo()
		c.o.Logger.Info("xds: configuration applied", "version", accepted, "resources", len(configs))
		if err := c.send(stream, accepted, resp.GetNonce(), nil); err != nil {
			return received, err
		}
	}
}

// Pace of the NACKs of a configuration the server sends again unchanged after its NACK: the
// first repeat is answered after minRepeatNACKPace, each further one after twice as long, up
// to maxRepeatNACKPace.
const (
	minRepeatNACKPace = 100 * time.Millisecond
	maxRepeatNACKPace = 2 * time.Second
)

// rejection is a response NACKed, and what its NACK said.
type rejection struct {
	version   string
	resources []*anypb.Any
	detail    *rpcstatus.Status
	pace      time.Duration
}

func newRejection(resp *discoveryv3.DiscoveryResponse, err error) *rejection {
	return &rejection{
		version:   resp.GetVersionInfo(),
		resources: resp.GetResources(),
		detail:    &rpcstatus.Status{Code: int32(codes.InvalidArgument), Message: err.Error()},
		pace:      minRepeatNACKPace,
	}
}

// repeatedBy reports whether resp sends again the state r rejected: same version, same
// resources, byte for byte.
func (r *rejection) repeatedBy(resp *discoveryv3.DiscoveryResponse) bool {
	if r == nil || resp.GetVersionInfo() != r.version || len(resp.GetResources()) != len(r.resources) {
		return false
	}
	for i, res := range resp.GetResources() {
		if res.GetTypeUrl() != r.resources[i].GetTypeUrl() || !bytes.Equal(res.GetValue(), r.resources[i].GetValue()) {
			return false
		}
	}
	return true
}

// sleep waits for d, or returns ctx's error if it ends first.
func sleep(ctx context.Context, d time.Duration) error {
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-timer.C:
		return nil
	}
}

// send sends a request: the subscription when nonce is empty, else the ACK (detail nil) or
// NACK of the response with that nonce.
func (c *client) send(stream discoveryv3.AggregatedDiscoveryService_StreamAggregatedResourcesClient,
	version, nonce string, detail *rpcstatus.Status) error {
	err := stream.Send(&discoveryv3.DiscoveryRequest{
		Node:          c.node,
		TypeUrl:       TypeURL,
		VersionInfo:   version,
		ResponseNonce: nonce,
		ErrorDetail:   detail,
	})
	if err == nil {
		return nil
	}
	if errors.Is(err, io.EOF) {
		// The stream is over; Recv returns why.
		_, err = stream.Recv()
	}
	return fmt.Errorf("xds: sending to %s: %w", c.o.ServerURL, err)
}

// decode unpacks the RateLimitConfig resources of resp.
func decode(resp *discoveryv3.DiscoveryResponse) ([]*rlsconfv3.RateLimitConfig, error) {
	configs := make([]*rlsconfv3.RateLimitConfig, 0, len(resp.GetResources()))
	for i, res := range resp.GetResources() {
		config := new(rlsconfv3.RateLimitConfig)
		if err := res.UnmarshalTo(config); err != nil {
			return nil, fmt.Errorf("xds: resource %d of version %q (%s) is not a RateLimitConfig: %w",
				i, resp.GetVersionInfo(), res.GetTypeUrl(), err)
		}
		configs = append(configs, config)
	}
	return configs, nil
}

// moduleVersion is the version of this module in the running binary, or "" when unknown (a
// development build).
func moduleVersion() string {
	const path = "github.com/strictrate/strictrate/rls"
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return ""
	}
	version := ""
	if info.Main.Path == path {
		version = info.Main.Version
	}
	for _, dep := range info.Deps {
		if dep.Path == path {
			version = dep.Version
		}
	}
	if version == "(devel)" {
		return ""
	}
	return version
}
