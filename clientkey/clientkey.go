// Package clientkey builds the engine keys with which httplimit and grpclimit limit a client,
// and is public so that a middleware of your own (for another server framework, a WebSocket
// handshake, a job queue) keys clients as they do and shares their counts.
//
// A key is a prefix, the policy's engine.Policy.Tag, ":" and the client's key (an address from
// package clientaddr, a header or metadata value, or a key function's result). Prefix writes
// what goes before the client, once per middleware; Checked and FromAddr check the client's
// key, for each request: not empty, at most MaxLength bytes. A middleware and an interceptor
// given the same prefix and policy share a client's count; a middleware of your own does too,
// given the same prefix, policy and client key.
//
// Each middleware passes its own error for a request it cannot key (httplimit.ErrKey,
// grpclimit.ErrKey, or yours) to be wrapped, so that its errors name it; this package has no
// error value of its own.
//
// grpclimit, a module of its own, builds its keys here too, and a program may pair a
// grpclimit release with a newer core module: like every public package of the core module,
// this one changes only compatibly (names and key layout are added to, never changed or
// removed) within a major version.
package clientkey

import (
	"errors"
	"fmt"

	"github.com/strictrate/strictrate/clientaddr"
	"github.com/strictrate/strictrate/engine"
)

// MaxLength is the longest client key, in bytes, that Checked and FromAddr pass (without the
// prefix and the policy's tag): a longer one is refused, so that a client cannot make the
// server store arbitrarily large keys. httplimit refuses longer keys by it, and
// grpclimit.MaxKeyLength is this value.
const MaxLength = 512

// Prefix returns what goes before a client's key in the engine key of a rate limit of policy
// p: prefix (a middleware's WithKeyPrefix, such as "http:"), p's tag and ":". So limits of
// different policies never share counts, and those of one policy and one prefix do.
func Prefix(prefix string, p engine.Policy) string { return prefix + p.Tag() + ":" }

// Checked returns key, as a key function, a header or clientaddr gave it with err (nil for a
// key that cannot fail), if err is nil and key is neither empty nor longer than MaxLength.
// Else it returns an error wrapping errKey and err, or errKey and the reason ("empty key",
// "key of N bytes, more than 512").
func Checked(errKey error, key string, err error) (string, error) {
	switch {
	case err != nil:
		return "", fmt.Errorf("%w: %w", errKey, err)
	case key == "":
		return "", fmt.Errorf("%w: empty key", errKey)
	case len(key) > MaxLength:
		return "", fmt.Errorf("%w: key of %d bytes, more than %d", errKey, len(key), MaxLength)
	}
	return key, nil
}

// FromAddr returns the key r gives a client that sent a request from peer (host:port, as
// net/http's Request.RemoteAddr or a gRPC peer's Addr.String() gives it) with the forwarding
// header (or metadata) lines, checked as Checked does; or an error wrapping errKey and r's
// error. For a peer on an untrusted Unix socket (clientaddr.ErrUnixSocket) the error goes on
// with "; or " and otherwise: the calling middleware's other ways of keying requests, such as
// "key requests with WithKeyFunc or WithKeyHeader".
func FromAddr(errKey error, r *clientaddr.Resolver, peer string, lines []string, otherwise string) (string, error) {
	key, err := r.Key(peer, lines)
	if errors.Is(err, clientaddr.ErrUnixSocket) {
		return "", fmt.Errorf("%w: %w; or %s", errKey, err, otherwise)
	}
	return Checked(errKey, key, err)
}
