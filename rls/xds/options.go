package xds

import (
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	rlsconfv3 "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
)

// ErrInvalidOptions is wrapped by the error Watch (and Validate) returns when Options cannot
// work at all (no server address, no node id); such an error is returned at once, not retried.
var ErrInvalidOptions = errors.New("xds: invalid options")

// Default backoff between two connection attempts, the reference server's defaults
// (XDS_CLIENT_BACKOFF_INITIAL_INTERVAL and XDS_CLIENT_BACKOFF_MAX_INTERVAL).
const (
	DefaultBackoffInitial = 10 * time.Second
	DefaultBackoffMax     = 60 * time.Second
)

// Options says which management server to ask, as whom, and how to reconnect. Only ServerURL
// and NodeID are required; the zero value of every other field is a working default.
type Options struct {
	// ServerURL is the management server's address, host:port, as gRPC dials it
	// (CONFIG_GRPC_XDS_SERVER_URL).
	ServerURL string
	// NodeID is the node id the management server keys its configuration by
	// (CONFIG_GRPC_XDS_NODE_ID); Envoy Gateway serves its rate limit configuration to
	// "envoy-ratelimit".
	NodeID string
	// NodeMetadata is sent as the node's metadata, every value a string
	// (CONFIG_GRPC_XDS_NODE_METADATA, see ParseNodeMetadata).
	NodeMetadata map[string]string
	// Headers are added as gRPC metadata to every stream
	// (CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS), for a server behind a proxy that routes or
	// authorizes on them.
	Headers map[string]string
	// TLS, when not nil, secures the connection: its RootCAs verify the server, its
	// Certificates are presented for mutual TLS, and its ServerName overrides the name
	// verified (CONFIG_GRPC_XDS_SERVER_TLS_SAN). Nil means plaintext.
	TLS *tls.Config
	// MaxRecvMsgSize bounds one response from the server, in bytes
	// (XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES); 0 keeps gRPC's default of 4 MiB.
	MaxRecvMsgSize int
	// BackoffInitial is the wait after the first failed attempt; each further failure doubles
	// it up to BackoffMax. Every wait is drawn between half and all of that value, so that
	// many replicas do not reconnect in step. A stream that delivered a response resets it.
	// Zero means DefaultBackoffInitial and DefaultBackoffMax.
	BackoffInitial time.Duration
	BackoffMax     time.Duration
	// Logger receives connection changes, accepted versions and rejected configurations.
	// Nil discards them.
	Logger *slog.Logger
}

// Validate reports whether o can work at all, as Watch would find at its start: an error
// wrapping ErrInvalidOptions for a missing server address or node id, a negative size, or a
// server address gRPC cannot parse. A program that must not start on options that will never
// work calls it first, since Watch, once it runs, retries everything else until ctx ends.
func (o Options) Validate() error {
	o, err := o.withDefaults()
	if err != nil {
		return err
	}
	_, err = newClient(o, func([]*rlsconfv3.RateLimitConfig) error { return nil })
	return err
}

// withDefaults checks o and fills in the defaults of its optional fields.
func (o Options) withDefaults() (Options, error) {
	if o.ServerURL == "" {
		return o, fmt.Errorf("%w: the management server's address (ServerURL) is empty", ErrInvalidOptions)
	}
	if o.NodeID == "" {
		return o, fmt.Errorf("%w: the node id (NodeID) is empty; the management server keys its configuration by it", ErrInvalidOptions)
	}
	if o.MaxRecvMsgSize < 0 {
		return o, fmt.Errorf("%w: MaxRecvMsgSize %d is negative", ErrInvalidOptions, o.MaxRecvMsgSize)
	}
	if o.BackoffInitial <= 0 {
		o.BackoffInitial = DefaultBackoffInitial
	}
	if o.BackoffMax <= 0 {
		o.BackoffMax = DefaultBackoffMax
	}
	if o.BackoffMax < o.BackoffInitial {
		o.BackoffMax = o.BackoffInitial
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	return o, nil
}

// ParseNodeMetadata reads CONFIG_GRPC_XDS_NODE_METADATA as the reference server does: entries
// separated by commas, each key=value (the value may itself hold '='). Entries without '='
// are skipped by the reference; they are returned in ignored so that the caller can name them
// in a warning (empty entries, as a trailing comma makes, are skipped silently).
func ParseNodeMetadata(s string) (metadata map[string]string, ignored []string) {
	metadata = make(map[string]string)
	if s == "" {
		return metadata, nil
	}
	for _, entry := range strings.Split(s, ",") {
		if entry == "" {
			continue
		}
		key, value, ok := strings.Cut(entry, "=")
		if !ok {
			ignored = append(ignored, entry)
			continue
		}
		metadata[key] = value
	}
	return metadata, ignored
}
