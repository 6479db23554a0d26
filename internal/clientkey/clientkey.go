// Package clientkey builds the engine keys of httplimit and grpclimit, so that the two
// middlewares key a client in one way: the same bound on a key's length, the same checks and
// error messages, and the same layout of the key, so that a middleware and an interceptor
// given the same prefix and policy share a client's count.
//
// A key is the middleware's prefix, the policy's engine.Policy.Tag, ":" and the client's key
// (an address from package clientaddr, a header or metadata value, or a key function's
// result). Prefix writes what goes before the client, once per middleware; Checked and
// FromAddr check the client's key, for each request.
//
// Each middleware passes its own ErrKey to be wrapped: the two are distinct errors (see
// httplimit.ErrKey), and this package has no error value of its own.
//
// grpclimit is a module of its own, github.com/strictrate/strictrate/grpclimit, that imports
// this package from the core module (its import path is under the core module's, which the
// internal rule allows). The two are released together, but a program's build may pair a
// grpclimit release with a newer core module: keep what grpclimit uses here working from one
// release to the next (add, do not change or remove).
package clientkey

import (
	"errors"
	"fmt"

	"github.com/strictrate/strictrate/clientaddr"
	"github.com/strictrate/strictrate/engine"
)

// MaxLength is the longest client key, in bytes, the middlewares send to the engine (without
// the prefix and the policy's tag): a longer one is refused, so that a client cannot make the
// server store arbitrarily large keys. httplimit.MaxKeyLength and grpclimit.MaxKeyLength are
// this value.
const MaxLength = 512

// Prefix returns what goes before a client's key in the engine key of a rate limit of policy
// p: prefix (the middleware's WithKeyPrefix), p's tag and ":". So middlewares of different
// policies never share counts, and those of one policy and one prefix do.
func Prefix(prefix string, p engine.Policy) string { return prefix + p.Tag() + ":" }

// Check returns nil if key may be sent to the engine, else an error wrapping errKey (the
// calling middleware's ErrKey) that says why: it is empty, or longer than MaxLength.
func Check(errKey error, key string) error {
	switch {
	case key == "":
		return fmt.Errorf("%w: empty key", errKey)
	case len(key) > MaxLength:
		return fmt.Errorf("%w: key of %d bytes, more than %d", errKey, len(key), MaxLength)
	}
	return nil
}

// Checked returns key, as a key function (or clientaddr) gave it with err, if err is nil and
// Check passes it; else an error wrapping errKey and err, or errKey and Check's reason.
func Checked(errKey error, key string, err error) (string, error) {
	if err != nil {
		return "", fmt.Errorf("%w: %w", errKey, err)
	}
	if err := Check(errKey, key); err != nil {
		return "", err
	}
	return key, nil
}

// FromAddr returns the key r gives a client that sent a request from peer with the
// forwarding header (or metadata) lines, checked, or an error wrapping errKey and r's error.
// For a peer on an untrusted Unix socket (clientaddr.ErrUnixSocket) the error goes on with
// "; or " and otherwise: the calling middleware's other ways of keying requests.
func FromAddr(errKey error, r *clientaddr.Resolver, peer string, lines []string, otherwise string) (string, error) {
	key, err := r.Key(peer, lines)
	if errors.Is(err, clientaddr.ErrUnixSocket) {
		return "", fmt.Errorf("%w: %w; or %s", errKey, err, otherwise)
	}
	return Checked(errKey, key, err)
}
