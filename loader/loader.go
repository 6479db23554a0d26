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
	"strconv"

	"github.com/valkey-io/valkey-go"

	"github.com/strictrate/strictrate/internal/nodes"
	"github.com/strictrate/strictrate/internal/sendctx"
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
//
// The call is made on ctx without its deadline (package sendctx): it still ends when ctx does,
// but a deadline that passes never closes a connection other calls share; and a call that a
// dial cut short, before anything was written, is sent again while ctx is live.
func (s *Script) Exec(ctx context.Context, client valkey.Client, keys, args []string) valkey.ValkeyResult {
	return sendctx.Send(ctx, func(ctx context.Context) valkey.ValkeyResult {
		return s.lua.Exec(ctx, client, keys, args)
	}, valkey.ValkeyResult.Error)
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
	return s.execThen(ctx, client, true, keys, args, then)
}

// ExecOnNode runs the script on node, a client of one node of a cluster (one of the cluster
// client's Nodes()), with keys that may be of several slots that node serves: as EVALSHA (or
// EVALSHA_RO), then EVAL after NOSCRIPT, like Exec.
//
// Such keys cannot be declared. The server refuses a call whose declared keys are of several
// slots (CROSSSLOT) before the script runs, whatever the script's flags (allow-cross-slot-keys
// lets a script reach keys it did not declare, not declare keys of several slots); and
// valkey-go's cluster command builder, which the clients of Nodes() share, panics on them. So
// the call declares none (numkeys 0) and passes, first in ARGV, the number of keys, then the
// keys, then args: the script must read its keys there (scripts/lib_keys.lua does) and carry
// the flag. The server then checks each key when the script reaches it: one of a slot the
// node does not serve fails that command ("Script attempted to access a non local key in a
// cluster node").
func (s *Script) ExecOnNode(ctx context.Context, node valkey.CoreClient, keys, args []string) valkey.ValkeyResult {
	return sendctx.Send(ctx, func(ctx context.Context) valkey.ValkeyResult {
		reply := node.Do(ctx, s.command(node.B(), false, false, keys, args))
		if verr, ok := valkey.IsValkeyErr(reply.Error()); ok && verr.IsNoScript() {
			reply = node.Do(ctx, s.command(node.B(), true, false, keys, args))
		}
		return reply
	}, valkey.ValkeyResult.Error)
}

// ExecThenOnNode is ExecThen for a call ExecOnNode makes: the keys undeclared, in ARGV, so
// that they may be of several slots of node; then's commands go behind it on the same
// connection, to the same node.
func (s *Script) ExecThenOnNode(ctx context.Context, node valkey.CoreClient, keys, args []string, then func([]valkey.Completed) []valkey.Completed) (script valkey.ValkeyResult, after []valkey.ValkeyResult) {
	return s.execThen(ctx, node, false, keys, args, then)
}

// execThen is ExecThen, with the keys declared (declare) or passed in ARGV (ExecOnNode).
func (s *Script) execThen(ctx context.Context, client valkey.CoreClient, declare bool, keys, args []string, then func([]valkey.Completed) []valkey.Completed) (script valkey.ValkeyResult, after []valkey.ValkeyResult) {
	b := client.B()
	replies := sendctx.Send(ctx, func(ctx context.Context) []valkey.ValkeyResult {
		replies := client.DoMulti(ctx, then(append(make([]valkey.Completed, 0, 4), s.command(b, false, declare, keys, args)))...)
		if verr, ok := valkey.IsValkeyErr(replies[0].Error()); !ok || !verr.IsNoScript() {
			return replies
		}
		return client.DoMulti(ctx, then(append(make([]valkey.Completed, 0, 4), s.command(b, true, declare, keys, args)))...)
	}, func(replies []valkey.ValkeyResult) error { return replies[0].Error() })
	return replies[0], replies[1:]
}

// command builds the script's call: EVALSHA (EVALSHA_RO for a read-only script), or with
// source EVAL (EVAL_RO) carrying the text. With declare the keys are the call's declared keys;
// without, the call declares none and ARGV opens with their number and the keys (ExecOnNode),
// which goes through the builder's Arg and so past its slot check.
func (s *Script) command(b valkey.Builder, source, declare bool, keys, args []string) valkey.Completed {
	if declare {
		n := int64(len(keys))
		switch {
		case s.readOnly && source:
			return b.EvalRo().Script(s.source).Numkeys(n).Key(keys...).Arg(args...).Build()
		case s.readOnly:
			return b.EvalshaRo().Sha1(s.sha1).Numkeys(n).Key(keys...).Arg(args...).Build()
		case source:
			return b.Eval().Script(s.source).Numkeys(n).Key(keys...).Arg(args...).Build()
		default:
			return b.Evalsha().Sha1(s.sha1).Numkeys(n).Key(keys...).Arg(args...).Build()
		}
	}
	count := strconv.Itoa(len(keys))
	switch {
	case s.readOnly && source:
		return b.EvalRo().Script(s.source).Numkeys(0).Arg(count).Arg(keys...).Arg(args...).Build()
	case s.readOnly:
		return b.EvalshaRo().Sha1(s.sha1).Numkeys(0).Arg(count).Arg(keys...).Arg(args...).Build()
	case source:
		return b.Eval().Script(s.source).Numkeys(0).Arg(count).Arg(keys...).Arg(args...).Build()
	default:
		return b.Evalsha().Sha1(s.sha1).Numkeys(0).Arg(count).Arg(keys...).Arg(args...).Build()
	}
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
			got, err := node.Do(sendctx.Of(ctx), node.B().ScriptLoad().Script(s.source).Build()).ToString()
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
