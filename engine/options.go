package engine

import (
	"fmt"
	"time"
)

// Mode chooses how the engine talks to the server.
type Mode int

const (
	// Atomic takes each decision in one EVALSHA of the sliding-window script: exact under any
	// concurrency, and the log never holds more than Max entries.
	Atomic Mode = iota
	// Pipelined sends ZREMRANGEBYSCORE, ZADD, ZCARD and PEXPIRE in one pipeline: the common
	// non-atomic design, kept as the baseline to measure Atomic against. Concurrent callers
	// interleave, and rejected attempts stay in the log.
	Pipelined
)

// String returns "atomic" or "pipelined".
func (m Mode) String() string {
	switch m {
	case Atomic:
		return "atomic"
	case Pipelined:
		return "pipelined"
	}
	return fmt.Sprintf("Mode(%d)", int(m))
}

// Option configures New.
type Option func(*options)

type options struct {
	mode           Mode
	prefix         string
	clock          func() time.Time
	preload        bool
	preloadTimeout time.Duration
}

func defaultOptions() options {
	return options{mode: Atomic, prefix: "strictrate:", preload: true, preloadTimeout: 10 * time.Second}
}

// WithMode selects Atomic (the default) or Pipelined.
func WithMode(m Mode) Option { return func(o *options) { o.mode = m } }

// WithPrefix sets the prefix put before every key; the default is "strictrate:". Keys of
// engines with different prefixes never meet.
func WithPrefix(prefix string) Option { return func(o *options) { o.prefix = prefix } }

// WithClock makes the engine decide with the caller's clock instead of the server's. Every
// process that shares a key must then share a clock; the server's clock (the default in Atomic
// mode) gives that for free. Pipelined mode always uses a caller's clock: this one, or time.Now.
func WithClock(now func() time.Time) Option { return func(o *options) { o.clock = now } }

// WithPreload controls whether New loads the scripts on every node (default true), so that a
// server without working scripting fails at start-up. Without it New sends nothing, and the
// first decision loads the script instead.
func WithPreload(preload bool) Option { return func(o *options) { o.preload = preload } }

// WithPreloadTimeout bounds how long New waits for the preload; the default is 10 seconds.
func WithPreloadTimeout(d time.Duration) Option { return func(o *options) { o.preloadTimeout = d } }
