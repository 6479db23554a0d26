package engine

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/valkey-io/valkey-go"

	"github.com/strictrate/strictrate/internal/sendctx"
)

// Pipelined mode is the seed article's design, kept to measure Atomic against: a key's log is
// a sorted set, one member per event scored by its time in microseconds, and a decision is one
// pipeline of ZREMRANGEBYSCORE, ZADD, ZCARD and PEXPIRE. It is not atomic: concurrent callers
// interleave, and a denied request stays in the log.
//
// It offers what the article offers, on its own keys: Allow, AllowN, Wait, WaitN and a Policy
// of one limit (the pipeline), Peek and Check (ZCOUNT, which records nothing), Record, and
// Clear or Reset (DEL). Everything that needs the atomic log (a Policy of several limits,
// PeekPolicy of several, Refund and Settle, Inspect, leases) returns an error wrapping
// ErrUnsupported before anything is sent. A key that holds something other than a sorted set
// (an Atomic engine's log, say) is refused with ErrUnknownLayout and never read as a count;
// but the pipeline cannot look before it writes, and its PEXPIRE still sets that key's
// expiry: keep the two modes on different prefixes.

// unsupported is the error of an operation Pipelined mode does not offer.
func unsupported(what string) error {
	return fmt.Errorf("strictrate: %s: %w: the engine is in Pipelined mode, whose log is the article's sorted set", what, ErrUnsupported)
}

// pipelinedOffers refuses, for op on key, a limit Pipelined mode cannot count: its log is the
// article's, one member per event, with neither slots nor calendar counters.
func pipelinedOffers(op, key string, l Limit) error {
	if l.Resolution > 0 || l.IsCalendar() {
		return unsupported(op + " " + quoteKey(key) + " against " + l.String())
	}
	return nil
}

// allowPipelined is the article's decision: trim, add, count and expire in one pipeline,
// admitted when the count after the add is at most Max. RetryAfter, ResetAfter and QuotaAfter
// cannot be known without more reads: all are the window.
func (e *Engine) allowPipelined(ctx context.Context, key string, l Limit, n int, at clockReading) (Result, error) {
	now, err := at.micros()
	if err != nil {
		return Result{}, err
	}
	full := e.prefix + key
	window := l.windowMicros()
	score := float64(now)
	members := make([]string, n)
	for i := range members {
		members[i] = e.nextMember()
	}
	pttl := ceilUnits(time.Millisecond, l.Window)
	replies := sendctx.Send(ctx, func(ctx context.Context) []valkey.ValkeyResult {
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
	// The error context is built only on failure: a decision that succeeds allocates nothing for
	// it, as in Atomic mode, so that the comparison measures the designs and not this.
	for _, r := range replies {
		if err := r.Error(); err != nil {
			return e.backendFailure(ctx, e.pipelinedError(ctx, "strictrate: allow "+quoteKey(key), full, err))
		}
	}
	count, err := replies[2].AsInt64()
	if err != nil {
		return e.backendFailure(ctx, fmt.Errorf("strictrate: allow %s: ZCARD reply: %w", quoteKey(key), err))
	}
	res := Result{Allowed: count <= int64(l.Max), ResetAfter: l.Window, QuotaAfter: l.Window, At: time.UnixMicro(now), Window: l.Window}
	if remaining := int64(l.Max) - count; remaining > 0 {
		res.Remaining = int(remaining)
	}
	if !res.Allowed {
		res.RetryAfter = l.Window
	}
	return res, nil
}

// peekPipelined is the article's check: the events in the window (ZCOUNT of the scores after
// now - window, which reads and writes nothing else), and whether n more would be admitted.
// Remaining is the room now; RetryAfter (when denied), ResetAfter and QuotaAfter (when the
// window holds an event) are the window, as for allowPipelined.
func (e *Engine) peekPipelined(ctx context.Context, key string, l Limit, n int, at clockReading) (Result, error) {
	now, err := at.micros()
	if err != nil {
		return Result{}, err
	}
	full := e.prefix + key
	count, err := e.do(ctx, func(b valkey.Builder) valkey.Completed {
		return b.Zcount().Key(full).Min("(" + strconv.FormatInt(now-l.windowMicros(), 10)).Max("+inf").Build()
	}).AsInt64()
	if err != nil {
		return e.backendFailure(ctx, e.pipelinedError(ctx, "strictrate: peek "+quoteKey(key), full, err))
	}
	res := Result{Allowed: count+int64(n) <= int64(l.Max), At: time.UnixMicro(now), Window: l.Window}
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

// pipelinedError classifies an error of a pipelined call on the full key: WRONGTYPE (the key
// holds no sorted set) is ErrUnknownLayout, naming what the key holds; the rest as classify.
func (e *Engine) pipelinedError(ctx context.Context, what, full string, err error) error {
	var verr *valkey.ValkeyError
	if !errors.As(err, &verr) || !strings.HasPrefix(verr.Error(), "WRONGTYPE") {
		return classify(ctx, what, err)
	}
	found := "another type"
	if typ, terr := e.do(ctx, func(b valkey.Builder) valkey.Completed { return b.Type().Key(full).Build() }).ToString(); terr == nil {
		found = "a " + typ
	}
	return fmt.Errorf("%s: %w: the key holds %s, not a Pipelined-mode log (a sorted set)", what, ErrUnknownLayout, found)
}

// nextMember returns a member unique across engines: the engine's random id, then a counter.
func (e *Engine) nextMember() string {
	var buf [8 + binary.MaxVarintLen64]byte
	copy(buf[:], e.memberID[:])
	k := binary.PutUvarint(buf[8:], e.seq.Add(1))
	return string(buf[:8+k])
}
