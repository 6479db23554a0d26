// Package pipelined is the common sliding window log that strictrate measures its engine
// against, and the interface of the classic design (Limiter: Check, Record, Clear).
//
// A key's log is a sorted set, one member per event scored by its time in microseconds, and a
// decision is one pipeline of ZREMRANGEBYSCORE, ZADD, ZCARD and PEXPIRE. A pipeline is not
// atomic: concurrent callers interleave, and a denied request stays in the log, so the count
// drifts from the truth (docs/benchmarks.md measures how far). It is kept for comparison, not
// for use: use package engine, whose decision is one atomic script call.
//
// An Engine here offers what the classic design offers, on its own keys: Allow, AllowN and
// Record (the pipeline), Peek and Check (ZCOUNT, which records nothing), Clear and Reset (DEL).
// A limit it cannot count (one with a Resolution, or a calendar limit) is refused with
// ErrUnsupported before anything is sent. A key that holds something other than a sorted set
// (an engine.Engine's log, say) is refused with engine.ErrUnknownLayout and never read as a
// count; but the pipeline cannot look before it writes, and its PEXPIRE still sets that key's
// expiry: keep the two on different prefixes.
package pipelined

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/valkey-io/valkey-go"

	"github.com/strictrate/strictrate/engine"
	"github.com/strictrate/strictrate/internal/callerr"
	"github.com/strictrate/strictrate/internal/sendctx"
)

// Limiter is the interface of the classic sliding-window-log design: Check and Record return
// an error matching engine.ErrRateLimitExceeded (an *engine.DeniedError, which carries the
// decision) when denied. Both an Engine here and *engine.Engine implement it, so code written
// against it can move to the exact engine unchanged.
type Limiter interface {
	Check(ctx context.Context, key string, limit int, window time.Duration, now time.Time) error
	Record(ctx context.Context, key string, limit int, window time.Duration, now time.Time) error
	Clear(ctx context.Context, key string) error
}

var (
	_ Limiter = (*Engine)(nil)
	_ Limiter = (*engine.Engine)(nil)
)

// ErrUnsupported is wrapped by the error of a limit the pipelined log cannot count: one with a
// Resolution, or a calendar limit. It matches errors.ErrUnsupported too; nothing is sent.
var ErrUnsupported = fmt.Errorf("pipelined: not offered by the pipelined log: %w", errors.ErrUnsupported)

// Engine decides as the common pipelined design does. It is safe for concurrent use.
type Engine struct {
	client valkey.Client
	prefix string
	clock  func() time.Time

	// Members are made on the client: an id random per engine, then a counter.
	memberID [8]byte
	seq      atomic.Uint64
}

// Option configures New.
type Option func(*Engine)

// WithPrefix sets the prefix put before every key; the default is engine's, "strictrate:".
func WithPrefix(prefix string) Option { return func(e *Engine) { e.prefix = prefix } }

// WithClock sets the clock decisions are taken on; the default is time.Now. The pipeline has
// no server clock to read: every process that shares a key must share a clock.
func WithClock(now func() time.Time) Option { return func(e *Engine) { e.clock = now } }

// New returns an engine of the pipelined design on client.
func New(client valkey.Client, opts ...Option) (*Engine, error) {
	if client == nil {
		return nil, fmt.Errorf("%w: nil client", engine.ErrInvalidArgument)
	}
	e := &Engine{client: client, prefix: "strictrate:", clock: time.Now}
	for _, opt := range opts {
		opt(e)
	}
	id := uuid.New()
	copy(e.memberID[:], id[:8])
	return e, nil
}

// Allow records one event for key, and it is admitted when the count after the add is at most
// l.Max: the pipeline adds first and counts after.
func (e *Engine) Allow(ctx context.Context, key string, l engine.Limit) (engine.Result, error) {
	return e.AllowN(ctx, key, l, 1)
}

// AllowN records n events for key, one member each, in one pipeline: trim, add, count and
// expire. It is admitted when the count after the add is at most l.Max; denied, the events
// stay recorded. RetryAfter, ResetAfter and QuotaAfter cannot be known without more reads:
// all are the window.
func (e *Engine) AllowN(ctx context.Context, key string, l engine.Limit, n int) (engine.Result, error) {
	return e.allowAt(ctx, key, l, n, e.clock())
}

func (e *Engine) allowAt(ctx context.Context, key string, l engine.Limit, n int, at time.Time) (engine.Result, error) {
	now, err := e.check(ctx, "allow", key, l, n, at)
	if err != nil {
		return engine.Result{}, err
	}
	full := e.prefix + key
	window := windowMicros(l)
	score := float64(now)
	members := make([]string, n)
	for i := range members {
		members[i] = e.nextMember()
	}
	pttl := (window + 999) / 1000
	replies, _ := sendctx.Promptly(ctx, func() []valkey.ValkeyResult {
		return sendctx.Send(ctx, func(ctx context.Context) []valkey.ValkeyResult {
			b := e.client.B()
			add := b.Zadd().Key(full).ScoreMember()
			for _, m := range members {
				add = add.ScoreMember(score, m)
			}
			return e.client.DoMulti(ctx,
				b.Zremrangebyscore().Key(full).Min("-inf").Max(strconv.FormatInt(now-window, 10)).Build(),
				add.Build(),
				b.Zcard().Key(full).Build(),
				b.Pexpire().Key(full).Milliseconds(pttl).Build(),
			)
		}, func(replies []valkey.ValkeyResult) error { return replies[0].Error() })
	}, func(err error) []valkey.ValkeyResult { return []valkey.ValkeyResult{valkey.NewErrorResult(err)} }, nil)
	for _, r := range replies {
		if err := r.Error(); err != nil {
			return engine.Result{}, e.failed(ctx, "allow", key, err)
		}
	}
	count, err := replies[2].AsInt64()
	if err != nil {
		return engine.Result{}, fmt.Errorf("pipelined: allow %q: ZCARD reply: %w", key, err)
	}
	res := engine.Result{Allowed: count <= int64(l.Max), ResetAfter: l.Window, QuotaAfter: l.Window,
		At: time.UnixMicro(now), Window: l.Window}
	if remaining := int64(l.Max) - count; remaining > 0 {
		res.Remaining = int(remaining)
	}
	if !res.Allowed {
		res.RetryAfter = l.Window
	}
	return res, nil
}

// Peek returns whether one more event for key would be admitted now: the events in the window
// (ZCOUNT of the scores after now minus the window, which reads and writes nothing else). Remaining
// is what the window admits now; RetryAfter (when denied), ResetAfter and QuotaAfter (when the
// window holds an event) are the window.
func (e *Engine) Peek(ctx context.Context, key string, l engine.Limit) (engine.Result, error) {
	return e.peekAt(ctx, key, l, e.clock())
}

func (e *Engine) peekAt(ctx context.Context, key string, l engine.Limit, at time.Time) (engine.Result, error) {
	now, err := e.check(ctx, "peek", key, l, 1, at)
	if err != nil {
		return engine.Result{}, err
	}
	full := e.prefix + key
	count, err := e.do(ctx, func(b valkey.Builder) valkey.Completed {
		return b.Zcount().Key(full).Min("(" + strconv.FormatInt(now-windowMicros(l), 10)).Max("+inf").Build()
	}).AsInt64()
	if err != nil {
		return engine.Result{}, e.failed(ctx, "peek", key, err)
	}
	res := engine.Result{Allowed: count+1 <= int64(l.Max), At: time.UnixMicro(now), Window: l.Window}
	if remaining := int64(l.Max) - count; remaining > 0 {
		res.Remaining = int(remaining)
	}
	if !res.Allowed {
		res.RetryAfter = l.Window
	}
	if count > 0 {
		res.ResetAfter, res.QuotaAfter = l.Window, l.Window
	}
	return res, nil
}

// Check reports whether one more event for key would be admitted at now, recording nothing:
// nil when it would, an *engine.DeniedError (engine.ErrRateLimitExceeded) when not.
func (e *Engine) Check(ctx context.Context, key string, limit int, window time.Duration, now time.Time) error {
	r, err := e.peekAt(ctx, key, engine.Limit{Max: limit, Window: window}, now)
	return deniedOrErr(key, r, err)
}

// Record records one event for key at now, and returns nil when the limit admitted it, an
// *engine.DeniedError (engine.ErrRateLimitExceeded) when not: the event is recorded either way.
func (e *Engine) Record(ctx context.Context, key string, limit int, window time.Duration, now time.Time) error {
	r, err := e.allowAt(ctx, key, engine.Limit{Max: limit, Window: window}, 1, now)
	return deniedOrErr(key, r, err)
}

// Clear forgets every event of key; it is Reset.
func (e *Engine) Clear(ctx context.Context, key string) error { return e.Reset(ctx, key) }

// Reset deletes key's log.
func (e *Engine) Reset(ctx context.Context, key string) error {
	if err := checkKey(ctx, key); err != nil {
		return err
	}
	full := e.prefix + key
	if err := e.do(ctx, func(b valkey.Builder) valkey.Completed { return b.Del().Key(full).Build() }).Error(); err != nil {
		return e.failed(ctx, "reset", key, err)
	}
	return nil
}

// check validates a request of n events of key against l at t, and returns t in microseconds.
func (e *Engine) check(ctx context.Context, op, key string, l engine.Limit, n int, t time.Time) (int64, error) {
	if err := checkKey(ctx, key); err != nil {
		return 0, err
	}
	if l.Resolution > 0 || l.IsCalendar() {
		return 0, fmt.Errorf("pipelined: %s %q against %s: %w", op, key, l, ErrUnsupported)
	}
	if err := (engine.Policy{l}).Validate(); err != nil {
		return 0, err
	}
	if n < 1 || n > l.Max {
		return 0, fmt.Errorf("%w: cost n %d is outside 1 to the limit's Max %d", engine.ErrInvalidArgument, n, l.Max)
	}
	// Times must stay exact as float64 scores once the window is subtracted.
	us := t.UnixMicro()
	if us <= -1<<52 || us >= 1<<52 {
		return 0, fmt.Errorf("%w: time %s is outside the years 1827 to 2112", engine.ErrInvalidArgument, t.Format(time.RFC3339Nano))
	}
	return us, nil
}

// checkKey refuses a nil context and an empty key before anything is sent.
func checkKey(ctx context.Context, key string) error {
	switch {
	case ctx == nil:
		return fmt.Errorf("%w: nil context", engine.ErrInvalidArgument)
	case key == "":
		return fmt.Errorf("%w: empty key", engine.ErrInvalidArgument)
	}
	return nil
}

// do sends the command build makes, as the engine sends its own (package sendctx).
func (e *Engine) do(ctx context.Context, build func(valkey.Builder) valkey.Completed) valkey.ValkeyResult {
	return sendctx.Do(ctx, e.client, build)
}

// failed wraps err, a call's failure on key: WRONGTYPE (the key holds no sorted set) is
// engine.ErrUnknownLayout, naming what the key holds; the rest as the engine classifies its
// own failures (the caller's cancellation or deadline, engine.ErrUnavailable, the server's
// reply).
func (e *Engine) failed(ctx context.Context, op, key string, err error) error {
	what := fmt.Sprintf("pipelined: %s %q", op, key)
	var verr *valkey.ValkeyError
	if !errors.As(err, &verr) || !strings.HasPrefix(verr.Error(), "WRONGTYPE") {
		return callerr.Classify(ctx, what, err)
	}
	found := "another type"
	if typ, terr := e.do(ctx, func(b valkey.Builder) valkey.Completed { return b.Type().Key(e.prefix + key).Build() }).ToString(); terr == nil {
		found = "a " + typ
	}
	return fmt.Errorf("%s: %w: the key holds %s, not a pipelined log (a sorted set)", what, engine.ErrUnknownLayout, found)
}

// nextMember returns a member unique across engines: the engine's random id, then a counter.
func (e *Engine) nextMember() string {
	var buf [8 + binary.MaxVarintLen64]byte
	copy(buf[:], e.memberID[:])
	k := binary.PutUvarint(buf[8:], e.seq.Add(1))
	return string(buf[:8+k])
}

// windowMicros is l's window in whole microseconds, rounded up, as the engine counts it.
func windowMicros(l engine.Limit) int64 {
	us := l.Window / time.Microsecond
	if l.Window%time.Microsecond != 0 {
		us++
	}
	return int64(us)
}

// deniedOrErr is the classic interface's verdict on a decision: err, a *engine.DeniedError
// when denied, else nil.
func deniedOrErr(key string, r engine.Result, err error) error {
	if err != nil {
		return err
	}
	if !r.Allowed {
		return &engine.DeniedError{Key: key, Result: r}
	}
	return nil
}
