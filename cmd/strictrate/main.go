// Command strictrate is the operator's tool for strictrate's keys: it shows what a key's log
// holds and deletes it.
//
//	go run ./cmd/strictrate inspect -addr host:port [-prefix p] [-limit 100/1m ...] KEY
//	go run ./cmd/strictrate reset -addr host:port [-prefix p] [-force] KEY
//
// inspect prints the key's calendar counters, if it has any (engine.Calendar limits; the log's
// layout 4), one line per period: "period <start> .. <end>: <n> events", in RFC 3339, in the zone
// of a -limit of that period, else in UTC; their events are not in the entries' count. Then the
// key's entries (time, cost, age), oldest first, and, for each -limit (repeat it for a policy's
// limits), the events in that window now, the events remaining and when the log empties; for a
// calendar -limit, the events in its current period, the events remaining and when the period ends.
// When every sliding -limit has a Resolution, the entries are slots (engine.Limit.Resolution):
// inspect says so, and each entry's time is its slot's end, its cost the events of all the slot's
// requests. It reads the log through the engine ([inspect.Read] and [engine.Engine.Peek]), the same
// code the decisions run, and changes nothing.
//
// A -limit is written as engine.Limit.String writes it: "100/1m" (Max, then the window as a Go
// duration), "100/1h~1m" (with a Resolution of a minute), or a calendar limit: "1000/month",
// "1000/day", "1000/week", "1000/year", in UTC unless a time zone follows an "@"
// ("1000/month@Europe/Berlin"; "Local" is this machine's), and for a month with a billing day
// other than the 1st, the day after a ":" ("1000/month:15@UTC"; "month-15", the name the
// RateLimit fields give it, is read too).
//
// reset deletes the key's log, as [engine.Engine.Reset] does, and says what it deleted: the log's
// entries and events as package inspect read them just before, and its calendar counters, one
// "period <start> .. <end>: <n> events" each (in UTC), or, for the pipelined design's log
// (package pipelined: a sorted set), its events. A key that does not exist is not an error: reset exits 0 and says
// that nothing was deleted (check -addr and -prefix). A key that is not a strictrate log (a
// string, a hash, a list in another layout...) is refused, named with its Valkey TYPE, and
// left as it is, with a non-zero exit; -force deletes it anyway.
//
// -addr takes a comma-separated list: the nodes of a cluster, or one server.
package main

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"
	_ "time/tzdata" // the calendar limits' zones, where the system has no zone database

	"github.com/valkey-io/valkey-go"

	"github.com/strictrate/strictrate/engine"
	"github.com/strictrate/strictrate/inspect"
)

func main() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := run(ctx, os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "strictrate:", err)
		os.Exit(2)
	}
}

// errUsage is wrapped by the errors of a command line the tool cannot run.
var errUsage = errors.New("usage: strictrate inspect -addr host:port [-prefix p] [-limit max/window[~resolution] | max/period[:day][@zone] ...] [-most n] KEY" +
	" | strictrate reset -addr host:port [-prefix p] [-force] KEY")

// errNotALog is wrapped by reset's refusal of a key that is not a strictrate log.
var errNotALog = errors.New("not a strictrate log")

// limitsFlag collects repeated -limit values (see parseLimit).
type limitsFlag []engine.Limit

func (f *limitsFlag) String() string { return fmt.Sprint(*f) }

// Set parses a limit as parseLimit does.
func (f *limitsFlag) Set(s string) error {
	l, err := parseLimit(s)
	if err != nil {
		return err
	}
	*f = append(*f, l)
	return nil
}

// validate checks every limit as the engine would.
func (f limitsFlag) validate() error {
	for _, l := range f {
		if err := (engine.Policy{l}).Validate(); err != nil {
			return err
		}
	}
	return nil
}

// parseLimit parses a limit as engine.Limit.String writes it: "100/1m", Max then the window as
// a Go duration; "100/1h~1m", with a Resolution; or a calendar limit, Max then its period
// ("day", "week", "month", "year"), a billing day after ":" or "-" ("month:15"), and a time zone
// after "@" ("month@Europe/Berlin"; UTC without one). It checks the syntax; validate checks the
// values, as the engine would.
func parseLimit(s string) (engine.Limit, error) {
	maxText, windowText, ok := strings.Cut(s, "/")
	if !ok {
		return engine.Limit{}, fmt.Errorf("limit %q: want max/window or max/period, such as 100/1m or 1000/month", s)
	}
	max, err := strconv.Atoi(maxText)
	if err != nil {
		return engine.Limit{}, fmt.Errorf("limit %q: max: %w", s, err)
	}
	if windowText != "" && (windowText[0] >= 'a' && windowText[0] <= 'z' || windowText[0] >= 'A' && windowText[0] <= 'Z') {
		return parseCalendar(s, max, windowText)
	}
	windowText, resolutionText, slotted := strings.Cut(windowText, "~")
	window, err := time.ParseDuration(windowText)
	if err != nil {
		return engine.Limit{}, fmt.Errorf("limit %q: window: %w", s, err)
	}
	l := engine.Limit{Max: max, Window: window}
	if slotted {
		if l.Resolution, err = time.ParseDuration(resolutionText); err != nil {
			return engine.Limit{}, fmt.Errorf("limit %q: resolution: %w", s, err)
		}
		if l.Resolution <= 0 {
			return engine.Limit{}, fmt.Errorf("limit %q: resolution %s is not positive", s, l.Resolution)
		}
	}
	return l, nil
}

// periods are the calendar periods a -limit names, by engine.Period's names.
var periods = map[string]engine.Period{"day": engine.Day, "week": engine.Week, "month": engine.Month, "year": engine.Year}

// parseCalendar parses the period of the calendar limit s of max events:
// "period[:day][@zone]".
func parseCalendar(s string, max int, text string) (engine.Limit, error) {
	text, zone, zoned := strings.Cut(text, "@")
	loc := time.UTC
	if zoned {
		var err error
		if loc, err = time.LoadLocation(zone); err != nil || zone == "" {
			return engine.Limit{}, fmt.Errorf("limit %q: time zone %q: %v", s, zone, cmp.Or(err, errors.New("empty")))
		}
	}
	name, dayText, billed := strings.Cut(text, ":")
	if !billed {
		name, dayText, billed = strings.Cut(text, "-")
	}
	period, ok := periods[strings.ToLower(name)]
	if !ok {
		return engine.Limit{}, fmt.Errorf("limit %q: period %q: want day, week, month or year (or a Go duration)", s, name)
	}
	l := engine.Calendar(max, period, loc)
	if billed {
		day, err := strconv.Atoi(dayText)
		if err != nil {
			return engine.Limit{}, fmt.Errorf("limit %q: billing day: %w", s, err)
		}
		l = l.WithBillingDay(day)
	}
	return l, nil
}

// run is the command without the process around it: args without the program name.
func run(ctx context.Context, args []string, out io.Writer) error {
	if len(args) == 0 {
		return errUsage
	}
	verb := args[0]
	fs := flag.NewFlagSet(verb, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	addr := fs.String("addr", "127.0.0.1:6379", "Valkey address(es), comma-separated")
	prefix := fs.String("prefix", "strictrate:", "the engine's key prefix (engine.WithPrefix)")
	most := fs.Int("most", 100, "inspect: the most entries to print, newest (0: all)")
	force := fs.Bool("force", false, "reset: delete the key even if it is not a strictrate log")
	var limits limitsFlag
	fs.Var(&limits, "limit", "inspect: a limit to count, such as 100/1m, 100/1h~1m or 1000/month@UTC (repeatable)")
	if err := fs.Parse(args[1:]); err != nil {
		return fmt.Errorf("%w: %w", errUsage, err)
	}
	if fs.NArg() != 1 || verb != "inspect" && verb != "reset" {
		return errUsage
	}
	key := fs.Arg(0)

	client, err := valkey.NewClient(valkey.ClientOption{InitAddress: strings.Split(*addr, ",")})
	if err != nil {
		return fmt.Errorf("connect to %s: %w", *addr, err)
	}
	defer client.Close()
	// The tool reads and deletes; it neither needs the scripts up front nor judges the eviction
	// policy or the persistence.
	e, err := engine.New(client, engine.WithPrefix(*prefix), engine.WithPreload(false), engine.WithEvictionCheck(engine.Ignore),
		engine.WithPersistenceCheck(engine.Ignore))
	if err != nil {
		return err
	}
	if verb == "reset" {
		return reset(ctx, client, e, key, *prefix, *force, out)
	}
	return inspectKey(ctx, client, e, key, *prefix, limits, *most, out)
}

// reset deletes key's log and says what it deleted. It refuses, unless force, a key that is
// not a strictrate log: one of another type, or a list the engine does not read as a log.
func reset(ctx context.Context, client valkey.Client, e *engine.Engine, key, prefix string, force bool, out io.Writer) error {
	if key == "" {
		return fmt.Errorf("%w: empty key", engine.ErrInvalidArgument)
	}
	full := prefix + key
	kind, err := client.Do(ctx, client.B().Type().Key(full).Build()).ToString()
	if err != nil {
		return fmt.Errorf("reset %q: TYPE %s: %w", key, full, err)
	}
	// deleted says what reset deletes, for its message; notLog, what the key holds when that
	// is not a strictrate log.
	var deleted, notLog string
	switch kind {
	case "none":
		fmt.Fprintf(out, "nothing deleted: there is no key %q (%s); check -addr and -prefix\n", key, full)
		return nil
	case "list":
		log, err := inspect.Read(ctx, client, full, 1)
		switch {
		case err == nil && consistent(log):
			deleted = fmt.Sprintf("the log of %q (%s): %d entries, %d events", key, full, log.Count, log.Events)
			sep := ", and its calendar counters: "
			for _, pc := range log.Periods {
				deleted += sep + periodLine(pc, nil)
				sep = "; "
			}
		case err == nil:
			notLog = "list whose first element does not decode to a consistent log"
		case errors.Is(err, engine.ErrUnknownLayout):
			notLog = "list in another layout"
		default:
			return err
		}
	case "zset":
		// The pipelined design's log (package pipelined) is a sorted set, one member per
		// event, which package inspect does not read; nothing tells it from another sorted set.
		n, err := client.Do(ctx, client.B().Zcard().Key(full).Build()).AsInt64()
		if err != nil {
			return fmt.Errorf("reset %q: ZCARD %s: %w", key, full, err)
		}
		deleted = fmt.Sprintf("the log of %q (%s): the pipelined sorted set of %d events", key, full, n)
	default:
		notLog = kind
	}
	if notLog != "" {
		if !force {
			return fmt.Errorf("reset %q (%s): the key holds a %s: %w; nothing deleted (reset -force deletes it anyway)",
				key, full, notLog, errNotALog)
		}
		deleted = fmt.Sprintf("%q (%s): a %s, not a strictrate log (-force)", key, full, kind)
	}
	// The check above and the delete below are two calls: a decision, another program or the
	// key's expiry may change the key in between, and the delete takes whatever is there then
	// (a log recreated by a decision, a key of another type), while the message reports what
	// the check saw. Closing that gap takes the check and the delete in one script, which is
	// the engine's to offer; for an operator's tool, run by hand on a key being reset, the gap
	// is acceptable.
	if err := e.Reset(ctx, key); err != nil {
		return err
	}
	fmt.Fprintf(out, "deleted %s\n", deleted)
	return nil
}

// periodLine describes a calendar counter: "period <start> .. <end>: <n> events", the times in
// RFC 3339, in the zone of a calendar limit of limits whose period it is, else in UTC.
func periodLine(pc inspect.Period, limits []engine.Limit) string {
	loc := time.UTC
	for _, l := range limits {
		if start, end := l.PeriodAt(pc.Start); l.IsCalendar() && start.Equal(pc.Start) && end.Equal(pc.End) {
			loc = start.Location()
			break
		}
	}
	return fmt.Sprintf("period %s .. %s: %d events", pc.Start.In(loc).Format(time.RFC3339), pc.End.In(loc).Format(time.RFC3339), pc.Events)
}

// slotOf returns the slot limits record their entries in: the smallest Resolution when every
// sliding limit has one, as the engine records a policy's entries; 0 for exact entries (or no
// sliding limit).
func slotOf(limits []engine.Limit) time.Duration {
	var slot time.Duration
	for _, l := range limits {
		switch {
		case l.IsCalendar():
		case l.Resolution <= 0:
			return 0
		case slot == 0 || l.Resolution < slot:
			slot = l.Resolution
		}
	}
	return slot
}

// consistent reports whether a log package inspect read, asked for its newest entry, holds
// together. The engine takes a list for a log by its first element's opening byte and length
// alone, so a foreign list that passes decodes as nonsense: counts out of range, or no entry
// where the count says there is one.
func consistent(l inspect.Log) bool {
	return l.Count >= 0 && l.Events >= 0 && len(l.Entries) == min(l.Count, 1) && (l.Count > 0 || l.Events == 0)
}

func inspectKey(ctx context.Context, client valkey.Client, e *engine.Engine, key, prefix string, limits []engine.Limit, most int, out io.Writer) error {
	log, err := inspect.Read(ctx, client, prefix+key, most)
	if err != nil {
		return err
	}
	// A peek reads the server's clock: the ages below are on it, as the decisions are.
	now := time.Now()
	if len(limits) > 0 {
		if err := limitsFlag(limits).validate(); err != nil {
			return err
		}
		r, err := e.Peek(ctx, key, limits[0])
		if err != nil {
			return err
		}
		now = r.At
	}
	fmt.Fprintf(out, "key %q (%s%s): %d entries, %d events (layout %d, %d cursors)\n", key, prefix, key, log.Count, log.Events,
		log.Layout, log.Cursors)
	if len(log.Periods) > 0 {
		fmt.Fprintf(out, "calendar counters (their events are not the entries'):\n")
	}
	for _, pc := range log.Periods {
		fmt.Fprintln(out, periodLine(pc, limits))
	}
	if len(log.Entries) < log.Count {
		fmt.Fprintf(out, "the newest %d entries:\n", len(log.Entries))
	}
	if slot := slotOf(limits); slot > 0 && len(log.Entries) > 0 {
		fmt.Fprintf(out, "entries are slots of %s (the -limit resolution): each one's time is its slot's end, its cost the events of all its requests\n", slot)
	}
	if len(log.Entries) > 0 {
		fmt.Fprintf(out, "%-30s %12s %14s\n", "time", "cost", "age")
	}
	for _, le := range log.Entries {
		fmt.Fprintf(out, "%-30s %12d %14s\n", le.At.UTC().Format("2006-01-02T15:04:05.000000Z"), le.Cost, now.Sub(le.At).Round(time.Microsecond))
	}
	for _, l := range limits {
		// Peeking with the largest Max counts the window (or the period) whatever it holds;
		// the limit's own Max then says what remains.
		wide := engine.Limit{Max: engine.MaxEvents, Window: l.Window, Resolution: l.Resolution}
		if l.IsCalendar() {
			wide = engine.Calendar(engine.MaxEvents, l.Period, l.Location).WithBillingDay(l.BillingDay)
		}
		r, err := e.Peek(ctx, key, wide)
		if err != nil {
			return err
		}
		count := engine.MaxEvents - r.Remaining
		if l.IsCalendar() {
			start, end := l.PeriodAt(r.At)
			fmt.Fprintf(out, "limit %s: %d events in the period %s .. %s, %d remaining, reset after %s\n",
				l, count, start.Format(time.RFC3339), end.Format(time.RFC3339), max(l.Max-count, 0), end.Sub(r.At).Round(time.Microsecond))
			continue
		}
		fmt.Fprintf(out, "limit %s: %d events in the window, %d remaining, reset after %s\n",
			l, count, max(l.Max-count, 0), r.ResetAfter.Round(time.Microsecond))
	}
	return nil
}
