package engine

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/strictrate/strictrate/loader"
)

// Log is a key's log as stored, read by Inspect.
type Log struct {
	// Events is the cost of every entry in the log, those that have left the longest window
	// but are not trimmed yet included: the log is trimmed by the next decision.
	Events int
	// Count is the number of entries in the log.
	Count int
	// Layout is the version of the layout the log is stored in (docs/design.md): 2 for what
	// this release writes by default, 3 for a log written under WithWriteLayout(3), 4 for a
	// log that keeps calendar counters (Calendar limits), 1 for a
	// log an earlier release wrote and no decision has rewritten yet; 0 for a key that does
	// not exist. Operators read it during an upgrade that changes
	// the layout (docs/operating.md).
	Layout int
	// Cursors is how many shorter windows the log keeps a count for (policies): the strictrate
	// command prints it, as it is part of what a log costs the server.
	Cursors int
	// Entries are the newest entries, oldest first: all of them, or as many as asked for. A
	// limit with a Resolution keeps one entry per slot: its At is the slot's end, its Cost the
	// events of every request of the slot.
	Entries []LogEntry
	// Periods are the key's calendar counters (Calendar limits), one per period live on the
	// key: what each has counted since its start. Their Events are not in Events, which counts
	// the entries.
	Periods []PeriodCount
}

// PeriodCount is a calendar counter of a key's log: the events admitted on the key within
// one calendar period.
type PeriodCount struct {
	// Start and End are the period: Start <= t < End, on the clock that decided.
	Start, End time.Time
	// Events is how many events the key admitted in the period, refunds taken off.
	Events int
}

// LogEntry is one admitted request's entry.
type LogEntry struct {
	// At is the request's time, to the microsecond.
	At time.Time
	// Cost is the events it counts for; 0 after a full Refund.
	Cost int
}

// Inspect reads key's log as stored, for operators (the strictrate command) and tests: its
// totals and its newest entries, at most most of them (0: all). It reads through the same
// script code the decisions use, and changes nothing. A key that does not exist has an empty
// Log.
func (e *Engine) Inspect(ctx context.Context, key string, most int) (Log, error) {
	if err := checkContext(ctx); err != nil {
		return Log{}, err
	}
	if err := validateKey(key); err != nil {
		return Log{}, err
	}
	if most < 0 {
		return Log{}, fmt.Errorf("%w: most %d is negative", ErrInvalidArgument, most)
	}
	what := "strictrate: inspect " + quoteKey(key)
	reply, _ := e.inspect.Exec(ctx, e.client, loader.Call{Keys: []string{e.prefix + key}, Args: []string{strconv.Itoa(most)}})
	vals, err := reply.AsIntSlice()
	if err != nil {
		return Log{}, classify(ctx, what, err)
	}
	if len(vals) < 5 || vals[4] < 0 || len(vals) < 5+3*int(vals[4]) || (len(vals)-5-3*int(vals[4]))%2 != 0 {
		return Log{}, fmt.Errorf("%s: reply has %d values, want 5, the counters' triples and pairs", what, len(vals))
	}
	l := Log{Events: int(vals[0]), Count: int(vals[1]), Layout: int(vals[2]), Cursors: int(vals[3])}
	first := 5 + 3*int(vals[4])
	for i := 5; i < first; i += 3 {
		l.Periods = append(l.Periods, PeriodCount{Start: time.UnixMicro(vals[i]), End: time.UnixMicro(vals[i+1]), Events: int(vals[i+2])})
	}
	for i := first; i < len(vals); i += 2 {
		l.Entries = append(l.Entries, LogEntry{At: time.UnixMicro(vals[i]), Cost: int(vals[i+1])})
	}
	return l, nil
}
