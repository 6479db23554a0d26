// Package inspect reads a strictrate log as it is stored, for operators (the strictrate
// command prints it) and tests: its totals, its newest entries and its calendar counters. It
// reads through the same script code the engine's decisions use (scripts/inspect.lua), runs
// read-only, and changes nothing.
package inspect

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/valkey-io/valkey-go"

	"github.com/strictrate/strictrate/engine"
	"github.com/strictrate/strictrate/internal/callerr"
	"github.com/strictrate/strictrate/loader"
	"github.com/strictrate/strictrate/scripts"
)

// Log is a key's log as stored.
type Log struct {
	// Events is the cost of every entry in the log, those that have left the longest window
	// but are not trimmed yet included: the log is trimmed by the next decision.
	Events int
	// Count is the number of entries in the log.
	Count int
	// Layout is the version of the layout the log is stored in (docs/design.md): 5, the one
	// this release writes and reads, for every log; 0 for a key that does not exist. A key of
	// any other layout is refused (engine.ErrUnknownLayout). Operators read it during an
	// upgrade that changes the layout (docs/operating.md).
	Layout int
	// Cursors is how many shorter windows the log keeps a count for (policies), a part of what
	// a log costs the server.
	Cursors int
	// Entries are the newest entries, oldest first: all of them, or as many as asked for. A
	// limit with a Resolution keeps one entry per slot: its At is the slot's end, its Cost the
	// events of every request of the slot.
	Entries []Entry
	// Periods are the key's calendar counters (calendar limits), one per period live on the
	// key: what each has counted since its start. Their Events are not in Events, which counts
	// the entries.
	Periods []Period
}

// Entry is one admitted request's entry.
type Entry struct {
	// At is the request's time, to the microsecond.
	At time.Time
	// Cost is the events it counts for; 0 after a full refund.
	Cost int
}

// Period is a calendar counter: the events admitted on the key within one calendar period.
type Period struct {
	// Start and End are the period: Start <= t < End, on the clock that decided.
	Start, End time.Time
	// Events is how many events the key admitted in the period, refunds taken off.
	Events int
}

// script is inspect.lua, read-only: it may be served where only reads are allowed.
var script = loader.NewReadOnly("inspect", scripts.Source("inspect"))

// Read returns the log stored at key, the key in Valkey (an engine's prefix, "strictrate:" by
// default, then the key it decides on), with its newest entries, at most most of them (0:
// all). A key that does not exist has an empty Log. A key that holds what no release of the
// engine wrote, or a later release's layout, is engine.ErrUnknownLayout; bad input is
// engine.ErrInvalidArgument, before anything is sent; a server that cannot answer,
// engine.ErrUnavailable.
func Read(ctx context.Context, client valkey.Client, key string, most int) (Log, error) {
	switch {
	case ctx == nil:
		return Log{}, fmt.Errorf("%w: nil context", engine.ErrInvalidArgument)
	case client == nil:
		return Log{}, fmt.Errorf("%w: nil client", engine.ErrInvalidArgument)
	case key == "":
		return Log{}, fmt.Errorf("%w: empty key", engine.ErrInvalidArgument)
	case most < 0:
		return Log{}, fmt.Errorf("%w: most %d is negative", engine.ErrInvalidArgument, most)
	}
	what := "strictrate: inspect " + strconv.Quote(cut(key))
	reply, _ := script.Exec(ctx, client, loader.Call{Keys: []string{key}, Args: []string{strconv.Itoa(most)}})
	vals, err := reply.AsIntSlice()
	if err != nil {
		return Log{}, callerr.Classify(ctx, what, err)
	}
	if len(vals) < 5 || vals[4] < 0 || len(vals) < 5+3*int(vals[4]) || (len(vals)-5-3*int(vals[4]))%2 != 0 {
		return Log{}, fmt.Errorf("%s: reply has %d values, want 5, the counters' triples and pairs", what, len(vals))
	}
	l := Log{Events: int(vals[0]), Count: int(vals[1]), Layout: int(vals[2]), Cursors: int(vals[3])}
	first := 5 + 3*int(vals[4])
	for i := 5; i < first; i += 3 {
		l.Periods = append(l.Periods, Period{Start: time.UnixMicro(vals[i]), End: time.UnixMicro(vals[i+1]), Events: int(vals[i+2])})
	}
	for i := first; i < len(vals); i += 2 {
		l.Entries = append(l.Entries, Entry{At: time.UnixMicro(vals[i]), Cost: int(vals[i+1])})
	}
	return l, nil
}

// cut shortens a key for an error message: a huge key costs no more than 128 bytes of it.
func cut(key string) string {
	const most = 128
	if len(key) <= most {
		return key
	}
	return strings.ToValidUTF8(key[:most], "") + "..."
}
