package engine

import (
	"fmt"
	"log/slog"
	"time"

	"go.opentelemetry.io/otel/metric"

	"github.com/strictrate/strictrate/internal/transport"
)

// Option configures New.
type Option func(*options)

type options struct {
	prefix           string
	clock            func() time.Time
	preload          bool
	preloadTimeout   time.Duration
	failOpen         bool
	ack              transport.Ack // WithReplicaAck, WithDurableAck
	evictionCheck    CheckLevel
	persistenceCheck CheckLevel
	logger           *slog.Logger
	batching         bool
	shadow           bool
	denyCacheEntries int
	meterProvider    metric.MeterProvider
	localQuota       *LocalQuota // WithLocalQuota; nil when off
}

func defaultOptions() options {
	return options{prefix: "strictrate:", preload: true, preloadTimeout: 10 * time.Second,
		evictionCheck: Refuse, persistenceCheck: Warn, logger: slog.Default(), batching: true}
}

// WithPrefix sets the prefix put before every key; the default is "strictrate:". Keys of
// engines with different prefixes never meet.
func WithPrefix(prefix string) Option { return func(o *options) { o.prefix = prefix } }

// WithClock makes the engine decide with the caller's clock instead of the server's. Every
// process that shares a key must then share a clock; the server's clock (the default) gives
// that for free. The clock must also pass time at the real rate: the server drops a key (a
// log, a key's leases) by its own clock, as long after the last write as the caller's clock
// said the key was needed, so under a clock that stands still a key goes while that clock's
// time still counts it.
func WithClock(now func() time.Time) Option { return func(o *options) { o.clock = now } }

// WithPreload controls whether New loads the scripts on every node (default true), so that a
// server without working scripting fails at start-up. Without it the first decision loads
// the script instead (New still reads maxmemory-policy unless WithEvictionCheck(Ignore),
// and INFO persistence unless WithPersistenceCheck(Ignore) without WithDurableAck).
func WithPreload(preload bool) Option { return func(o *options) { o.preload = preload } }

// WithPreloadTimeout bounds how long New waits for all its checks of the servers together:
// the preload and the permission probe (WithPreload), the eviction check (WithEvictionCheck)
// and the persistence check (WithPersistenceCheck, WithDurableAck). The default is 10 seconds.
// (The name is older than the other checks.)
func WithPreloadTimeout(d time.Duration) Option { return func(o *options) { o.preloadTimeout = d } }

// WithFailOpen sets the policy for a decision the server could not take (unreachable, an
// error reply such as LOADING or OOM, the client's own timeout). The default, fail-closed,
// returns the error and a Result that denies. Fail-open admits instead: the Result has Allowed
// true and BackendErr set to the error, and the call returns a nil error. Fail-open trades the
// limit's promise for availability: use it only where letting a request through unlimited is
// cheaper than refusing it.
//
// Invalid arguments, a key the engine cannot read (ErrUnknownLayout) and a call that ended
// with its caller are returned as errors either way: a context cancelled, or whose deadline
// passed before the server answered, is the caller's own end, never an admission (else a
// client that sets a short deadline would be let past a used-up limit). To bound how long a
// fail-open decision waits for a slow server, end its context with a cause that wraps
// ErrUnavailable, context.WithTimeoutCause(ctx, d, engine.ErrUnavailable): that bound is the
// server's to meet, and its expiry fails open.
func WithFailOpen(failOpen bool) Option { return func(o *options) { o.failOpen = failOpen } }

// WithReplicaAck makes every decision wait, in the same round trip, until at least replicas
// replicas hold it (WAIT replicas timeout), so that an admitted event survives the primary's
// failover. An admission that fewer replicas acknowledged within timeout returns an error
// wrapping ErrUnavailable (the event stays recorded on the primary: the error can only
// under-admit). Denials wait too but ignore the count. replicas < 1 turns it off (the
// default); timeout is rounded up to whole milliseconds, and 0 means the WAIT may block
// until the context ends. The cost is real: valkey-go sends WAIT on a connection of its own,
// so acknowledged decisions are not pipelined (docs/benchmarks.md has the figures).
func WithReplicaAck(replicas int, timeout time.Duration) Option {
	return func(o *options) { o.ack.Replicas, o.ack.Timeout = replicas, timeout }
}

// WithDurableAck makes every admission wait until it is fsynced (WAITAOF local replicas
// timeout): to the server's own append-only file when local is 1, and to the files of at least
// replicas replicas, so that it survives a power loss, not only a crash of the server.
//
//   - An admission not fsynced as asked within timeout returns an error wrapping
//     ErrUnavailable instead of admitting; its events stay recorded, so it can only
//     under-admit, never over-admit.
//   - The WAITAOF follows the reply of a call that admitted something, on its connection: one
//     per call, however many decisions it carries. A denial never waits for a disk.
//   - local 1 needs appendonly yes and an appendfsync that fsyncs: New fails with
//     ErrPersistence otherwise. Run appendfsync always, on the replicas too: under everysec
//     Valkey acknowledges on its cron tick whether or not the fsync ran, and New logs a warning
//     (WithPersistenceCheck(Refuse) makes it fail instead).
//   - local must be 0 or 1 and replicas at least 0; both 0 turn it off (the default). timeout
//     is rounded up to whole milliseconds, and 0 waits until the context ends. With
//     WithReplicaAck too, WAIT goes in the call's round trip and WAITAOF after it.
//
// docs/operating.md, "What a crash forgets", says what each setting loses, why the WAITAOF
// comes after the reply, and what it costs.
func WithDurableAck(local, replicas int, timeout time.Duration) Option {
	return func(o *options) { o.ack.AOFLocal, o.ack.AOFReplicas, o.ack.AOFTimeout = local, replicas, timeout }
}

// validateDurableAck checks WithDurableAck's arguments.
func (o *options) validateDurableAck() error {
	switch {
	case o.ack.AOFLocal == 0 && o.ack.AOFReplicas == 0:
		return nil
	case o.ack.AOFLocal < 0 || o.ack.AOFLocal > 1 || o.ack.AOFReplicas < 0 || o.ack.AOFTimeout < 0:
		return fmt.Errorf("%w: WithDurableAck(%d, %d, %s): local must be 0 or 1, replicas and timeout at least 0",
			ErrInvalidArgument, o.ack.AOFLocal, o.ack.AOFReplicas, o.ack.AOFTimeout)
	}
	return nil
}

// CheckLevel is what New does when one of its checks of the servers finds a setting that can
// make the engine forget admitted events (WithEvictionCheck, WithPersistenceCheck).
type CheckLevel int

const (
	// Refuse makes New fail: with ErrEvictionPolicy or ErrPersistence, naming the nodes.
	Refuse CheckLevel = iota
	// Warn makes New log a warning through the engine's logger (WithLogger), naming the nodes,
	// and go on. Each node (each server process: its run_id) is warned about once per process,
	// however many engines the process makes.
	Warn
	// Ignore skips the check and the command it sends.
	Ignore
)

// WithEvictionCheck sets what New does when a node's maxmemory-policy may evict any key
// (allkeys-*): an evicted log forgets admitted events, and the limit admits them again. The
// default is Refuse. A server that refuses CONFIG GET (managed services often do) is not
// checked.
func WithEvictionCheck(c CheckLevel) Option { return func(o *options) { o.evictionCheck = c } }

// WithPersistenceCheck sets what New does when a primary keeps the logs only in memory: neither
// an append-only file (appendonly yes) nor a connected replica. A restart of such a server
// forgets every key's log, and each key may then admit up to its Max again at once (an RDB
// snapshot, where configured, brings back only the logs as of the last snapshot). It also
// applies, under WithDurableAck with a local fsync, to a primary running appendfsync everysec
// (whose WAITAOF may answer before the fsync). The default is Warn. A server that refuses INFO
// is not checked (Ignore skips INFO unless WithDurableAck needs it).
func WithPersistenceCheck(c CheckLevel) Option {
	return func(o *options) { o.persistenceCheck = c }
}

// WithLogger sets where the engine logs warnings (log/slog, so a program can route, filter or
// silence them); the default is slog.Default(), and nil logs nothing.
func WithLogger(l *slog.Logger) Option { return func(o *options) { o.logger = l } }

// WithBatching turns group commit on (the default) or off. On, concurrent decisions bound for the same
// server (in a cluster, the same primary, whatever their slots) share one EVALSHA: a decision is sent at once when
// nothing is in flight there, and while calls are in flight, new decisions queue and leave
// together in the next one (at most 128 per call). Every decision keeps its own limit, cost
// and Result, and is decided exactly as alone; the same key twice in one call is decided
// twice, in order. A call's fixed cost on the server (starting the script, reading its clock)
// and on the client (a round trip, a syscall) is shared by its decisions, so under load the
// server does more decisions per second; a decision sent alone goes as the single-decision
// script, so with one request at a time nothing changes. Peeks batch apart from decisions.
// Off, every decision is its own EVALSHA.
func WithBatching(on bool) Option { return func(o *options) { o.batching = on } }

// WithShadow turns shadow mode on: every decision runs as usual, and a request the limit
// denies is admitted anyway, with Result.ShadowDenied set (the metrics count it as
// shadow_denied). The log records only what the limit admitted, so switching shadow off
// enforces a log that tells the truth. Use it to try a new limit on live traffic before
// enforcing it. Peek and Check answer as Allow would: admitted, marked ShadowDenied.
func WithShadow(on bool) Option { return func(o *options) { o.shadow = on } }

// WithDenyCache keeps up to entries keys' recent denials in memory (least recently used out
// first), so that a key under abuse is refused without a round trip: after a denial, a later
// request for the same key, limits (or policy) and a cost at least the denied one's is denied
// at once, Result.FromCache set, until the denial's RetryAfter has run from the moment its
// call was sent (that moment precedes the server's decision, so the cache never denies past
// the real denial). Its Result counts RetryAfter down. Reset, Refund and Settle through this
// engine clear the key's denials; through another process they do not: events they give back
// are seen when the cached RetryAfter runs out. entries < 1 turns it off (the default).
func WithDenyCache(entries int) Option { return func(o *options) { o.denyCacheEntries = entries } }

// WithMeterProvider sets where the engine's metrics go (OpenTelemetry's metric API; the
// docs/production.md lists them). The default is the global provider, otel.GetMeterProvider, which
// records nothing until the program sets one.
func WithMeterProvider(mp metric.MeterProvider) Option {
	return func(o *options) { o.meterProvider = mp }
}
