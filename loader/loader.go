// Package loader turns Lua sources into handles that run through valkey-go's script cache.
// It is the engine's: it exports what the engine package needs, and programs have no reason
// to import it.
//
// A Script runs as EVALSHA (or EVALSHA_RO for read-only scripts) and sends the source with EVAL
// only when the server answers NOSCRIPT, after a restart or a SCRIPT FLUSH. Preload puts the
// scripts on every node up front, so a server whose scripting is disabled or broken fails when
// the program starts, not on its first request.
package loader

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"errors"
	"fmt"

	"github.com/valkey-io/valkey-go"

	"github.com/strictrate/strictrate/internal/nodes"
)

// ErrPreload is wrapped by every error Preload returns, so callers can tell a script that
// could not be loaded from other start-up failures.
var ErrPreload = errors.New("loader: script preload failed")

// Script is a Lua script bound to valkey-go's script cache. It is safe for concurrent use.
type Script struct {
	name     string
	source   string
	sha1     string
	readOnly bool
	lua      *valkey.Lua
}

// New returns a handle for a script that may write: it runs as EVALSHA, falling back to EVAL
// on NOSCRIPT. valkey-go never retries it on its own, so a decision is never applied twice.
// The name appears in errors.
func New(name, source string) *Script {
	return newScript(name, source, false, valkey.NewLuaScript(source))
}

// NewReadOnly returns a handle for a script that only reads: it runs as EVALSHA_RO (falling back
// to EVAL_RO), which replicas may serve and valkey-go may retry.
func NewReadOnly(name, source string) *Script {
	return newScript(name, source, true, valkey.NewLuaScriptReadOnly(source))
}

func newScript(name, source string, readOnly bool, lua *valkey.Lua) *Script {
	sum := sha1.Sum([]byte(source))
	return &Script{name: name, source: source, sha1: hex.EncodeToString(sum[:]), readOnly: readOnly, lua: lua}
}

// SHA1 returns the hex SHA-1 digest of the source: the name EVALSHA calls the script by.
func (s *Script) SHA1() string { return s.sha1 }

// ReadOnly reports whether the script runs as EVALSHA_RO.
func (s *Script) ReadOnly() bool { return s.readOnly }

// Exec runs the script with the given keys and arguments as one EVALSHA, or EVAL after NOSCRIPT.
// The result is valkey-go's, unwrapped, so the caller reads the reply without another copy.
func (s *Script) Exec(ctx context.Context, client valkey.Client, keys, args []string) valkey.ValkeyResult {
	return s.lua.Exec(ctx, client, keys, args)
}

// ExecThen runs the script as Exec does and sends the commands then appends right behind it,
// in the same round trip and on the same connection: for WAIT, which waits until that
// connection's writes reach replicas. then receives a slice holding the script's
// command and returns it with its own appended; it is called again after NOSCRIPT (a command
// cannot be sent twice), when everything goes again with the script as EVAL. In a cluster,
// then's commands must be keyless or in the script's slot. client may be a dedicated
// connection (valkey.DedicatedClient), so that a caller can send more on the same connection
// once it has read the reply. It returns the script's reply, and theirs in the order then
// appended them.
func (s *Script) ExecThen(ctx context.Context, client valkey.CoreClient, keys, args []string, then func([]valkey.Completed) []valkey.Completed) (script valkey.ValkeyResult, after []valkey.ValkeyResult) {
	b := client.B()
	var first valkey.Completed
	if s.readOnly {
		first = b.EvalshaRo().Sha1(s.sha1).Numkeys(int64(len(keys))).Key(keys...).Arg(args...).Build()
	} else {
		first = b.Evalsha().Sha1(s.sha1).Numkeys(int64(len(keys))).Key(keys...).Arg(args...).Build()
	}
	replies := client.DoMulti(ctx, then(append(make([]valkey.Completed, 0, 4), first))...)
	if verr, ok := valkey.IsValkeyErr(replies[0].Error()); !ok || !verr.IsNoScript() {
		return replies[0], replies[1:]
	}
	if s.readOnly {
		first = b.EvalRo().Script(s.source).Numkeys(int64(len(keys))).Key(keys...).Arg(args...).Build()
	} else {
		first = b.Eval().Script(s.source).Numkeys(int64(len(keys))).Key(keys...).Arg(args...).Build()
	}
	replies = client.DoMulti(ctx, then(append(make([]valkey.Completed, 0, 4), first))...)
	return replies[0], replies[1:]
}

// Preload runs SCRIPT LOAD for every script on every node the client knows (client.Nodes():
// one for a standalone server, every primary and replica of a cluster). It returns an error
// wrapping ErrPreload and the server's error, naming the script and the node, when any load
// fails or a node reports a digest other than the script's.
func Preload(ctx context.Context, client valkey.Client, scripts ...*Script) error {
	if client == nil {
		return fmt.Errorf("%w: nil client", ErrPreload)
	}
	var errs []error
	for _, n := range nodes.Sorted(client) {
		node, addr := n.Client, n.Addr
		for _, s := range scripts {
			got, err := node.Do(ctx, node.B().ScriptLoad().Script(s.source).Build()).ToString()
			switch {
			case err != nil:
				errs = append(errs, fmt.Errorf("%w: SCRIPT LOAD %s on %s: %w", ErrPreload, s.name, addr, err))
			case got != s.sha1:
				errs = append(errs, fmt.Errorf("%w: SCRIPT LOAD %s on %s returned digest %s, want %s", ErrPreload, s.name, addr, got, s.sha1))
			}
		}
	}
	return errors.Join(errs...)
}
