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

// Call is what one call of a script sends: its keys and arguments, how the keys go, and the
// commands that follow it in the same round trip.
type Call struct {
	// Keys are the keys the script touches; Args its arguments.
	Keys, Args []string
	// Undeclared passes the keys in ARGV instead of declaring them: the number of keys, then
	// the keys, then Args, with numkeys 0. It is for a call to one node of a cluster (a client
	// from the cluster client's Nodes()) with keys of several slots that node serves, which
	// cannot be declared: the server refuses a call whose declared keys are of several slots
	// (CROSSSLOT) before the script runs, and valkey-go's cluster command builder panics on
	// them. The script must read its keys from ARGV (scripts/lib_keys.lua does) and carry the
	// flag allow-cross-slot-keys; the server then checks each key as the script reaches it, and
	// a key of a slot the node does not serve fails that command ("Script attempted to access a
	// non local key in a cluster node").
	Undeclared bool
	// Then, when set, returns commands to send right behind the script on its connection, in
	// the same round trip: WAIT, which waits until that connection's writes reach replicas. In
	// a cluster they must be keyless or of the script's slot. It is called again when the
	// call goes again (after NOSCRIPT, or a dial that wrote nothing): a command is sent once.
	Then func(valkey.Builder) []valkey.Completed
}

// Exec runs the script as one EVALSHA (EVALSHA_RO for a read-only script), and sends its source
// with EVAL (EVAL_RO) only when the server answers NOSCRIPT, after a restart or a SCRIPT FLUSH.
// It returns the script's reply, unwrapped, so the caller reads it without another copy, and
// the replies of Then's commands, in their order (nil without Then). client may be the engine's
// client, a cluster node's (Call.Undeclared), or a dedicated connection
// (valkey.DedicatedClient), on which the caller can send more once it has read the reply.
//
// The call is made on ctx without its deadline (package sendctx): it still ends when ctx does,
// but a deadline that passes never closes a connection other calls share; and a call that a
// dial cut short, before anything was written, is sent again while ctx is live. A script that
// may write is never retried by valkey-go, so a decision is never applied twice.
func (s *Script) Exec(ctx context.Context, client valkey.CoreClient, c Call) (reply valkey.ValkeyResult, then []valkey.ValkeyResult) {
	if c.Then == nil {
		if cc, ok := client.(valkey.Client); ok && !c.Undeclared {
			// valkey-go's script cache: EVALSHA, EVAL after NOSCRIPT.
			return sendctx.Send(ctx, func(ctx context.Context) valkey.ValkeyResult {
				return s.lua.Exec(ctx, cc, c.Keys, c.Args)
			}, valkey.ValkeyResult.Error), nil
		}
		return sendctx.Send(ctx, func(ctx context.Context) valkey.ValkeyResult {
			reply := client.Do(ctx, s.command(client.B(), false, c))
			if verr, ok := valkey.IsValkeyErr(reply.Error()); ok && verr.IsNoScript() {
				reply = client.Do(ctx, s.command(client.B(), true, c))
			}
			return reply
		}, valkey.ValkeyResult.Error), nil
	}
	replies := sendctx.Send(ctx, func(ctx context.Context) []valkey.ValkeyResult {
		b := client.B()
		replies := client.DoMulti(ctx, append([]valkey.Completed{s.command(b, false, c)}, c.Then(b)...)...)
		if verr, ok := valkey.IsValkeyErr(replies[0].Error()); !ok || !verr.IsNoScript() {
			return replies
		}
		return client.DoMulti(ctx, append([]valkey.Completed{s.command(b, true, c)}, c.Then(b)...)...)
	}, func(replies []valkey.ValkeyResult) error { return replies[0].Error() })
	return replies[0], replies[1:]
}

// command builds the script's call: EVALSHA (EVALSHA_RO for a read-only script), or with
// source EVAL (EVAL_RO) carrying the text; the keys declared, or, Undeclared, in ARGV after
// their number, which goes through the builder's Arg and so past its slot check.
func (s *Script) command(b valkey.Builder, source bool, c Call) valkey.Completed {
	if !c.Undeclared {
		n := int64(len(c.Keys))
		switch {
		case s.readOnly && source:
			return b.EvalRo().Script(s.source).Numkeys(n).Key(c.Keys...).Arg(c.Args...).Build()
		case s.readOnly:
			return b.EvalshaRo().Sha1(s.sha1).Numkeys(n).Key(c.Keys...).Arg(c.Args...).Build()
		case source:
			return b.Eval().Script(s.source).Numkeys(n).Key(c.Keys...).Arg(c.Args...).Build()
		default:
			return b.Evalsha().Sha1(s.sha1).Numkeys(n).Key(c.Keys...).Arg(c.Args...).Build()
		}
	}
	count := strconv.Itoa(len(c.Keys))
	switch {
	case s.readOnly && source:
		return b.EvalRo().Script(s.source).Numkeys(0).Arg(count).Arg(c.Keys...).Arg(c.Args...).Build()
	case s.readOnly:
		return b.EvalshaRo().Sha1(s.sha1).Numkeys(0).Arg(count).Arg(c.Keys...).Arg(c.Args...).Build()
	case source:
		return b.Eval().Script(s.source).Numkeys(0).Arg(count).Arg(c.Keys...).Arg(c.Args...).Build()
	default:
		return b.Evalsha().Sha1(s.sha1).Numkeys(0).Arg(count).Arg(c.Keys...).Arg(c.Args...).Build()
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
