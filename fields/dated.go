package fields

import (
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/strictrate/strictrate/engine"
)

// Dated writes the fields of a policy that may hold calendar limits (engine.Calendar), whose
// fields depend on when the decision was taken: a calendar limit is named by its period
// (LimitName) and given, as w, the length of the period the decision fell in, so November's
// month has 30 days and December's 31. httplimit and grpclimit write their fields through it,
// so that both name and measure a calendar limit alike.
//
// For a policy of sliding limits alone, Dated writes New's fields, prepared once: it does no
// more per decision than Fields. With calendar limits, the fields are made once per period
// and kept until it ends, so a decision only checks that its time is still in the period of
// the fields held. Make a Dated once, with NewDated, and use it for every decision: it is
// safe for concurrent use.
type Dated struct {
	all      *Fields // the policy's fields; used as they are when no limit is a calendar one
	calendar bool    // the policy holds a calendar limit
	version  Version
	limits   engine.Policy
	names    []string  // per limit, its name in the fields (LimitName)
	quoted   []string  // per limit, its name as the fields write it, quoted
	sliding  []*Fields // per sliding limit, the fields of a policy of it alone; nil for a calendar limit
	current  atomic.Pointer[periodFields]
}

// periodFields are the fields of a policy with calendar limits for the decisions taken in
// [from, to), where every calendar limit is in one period.
type periodFields struct {
	from, to time.Time
	policy   []Field
	// limits holds, per limit of the policy, the fields of a policy of it alone: for a calendar
	// limit, of a sliding limit of its Max and the period's length, whose quoted window name,
	// stand-in, the fields written replace with the calendar limit's quoted name.
	limits  []*Fields
	standIn []string
	// windows holds the Window a Result gives each limit: its own, or the period's length.
	windows  []time.Duration
	fallback int // the limit named for a Result that names none: the smallest Max
}

// NewDated prepares the fields of p, calendar limits included, in v's syntax. The error is
// New's: it wraps engine.ErrInvalidArgument for an invalid policy or a revision this package
// does not write.
func NewDated(p engine.Policy, v Version) (*Dated, error) {
	all, err := New(p, v)
	if err != nil {
		return nil, err
	}
	f := &Dated{all: all, version: v, limits: append(engine.Policy(nil), p...), names: make([]string, len(p)), quoted: make([]string, len(p))}
	for i, l := range p {
		f.calendar = f.calendar || l.IsCalendar()
		f.names[i] = LimitName(l, p)
		f.quoted[i] = strconv.Quote(f.names[i])
	}
	if !f.calendar {
		return f, nil
	}
	f.sliding = make([]*Fields, len(p))
	for i, l := range p {
		if !l.IsCalendar() {
			if f.sliding[i], err = New(engine.Policy{l}, v); err != nil {
				return nil, err
			}
		}
	}
	return f, nil
}

// Names returns the name of every field f writes, as Fields.Names does.
func (f *Dated) Names() []string { return f.all.Names() }

// Policy returns the fields that describe the policy for a decision taken at at (the zero
// time: now; a Result's At): the same for every decision in one period of each calendar
// limit, including one admitted by a fail-open engine without a decision. The slice is
// shared: do not modify it.
func (f *Dated) Policy(at time.Time) []Field {
	if !f.calendar {
		return f.all.Policy()
	}
	return f.at(at).policy
}

// AppendDecision appends to dst the fields that report r, for the period of r.At, and returns
// the extended slice, as Fields.AppendDecision does: nothing for a Result a fail-open engine
// admitted without deciding.
func (f *Dated) AppendDecision(dst []Field, r engine.Result) []Field {
	if !f.calendar {
		return f.all.AppendDecision(dst, r)
	}
	if r.BackendErr != nil {
		return dst
	}
	d := f.at(r.At)
	i := d.named(f.limits, r)
	n := len(dst)
	dst = d.limits[i].AppendDecision(dst, r)
	if f.limits[i].IsCalendar() {
		for j := n; j < len(dst); j++ {
			if rest, ok := strings.CutPrefix(dst[j].Value, d.standIn[i]); ok {
				dst[j].Value = f.quoted[i] + rest
			}
		}
	}
	return dst
}

// Named returns the limit AppendDecision's fields name for r, and its name there (LimitName),
// for callers that report the limit in their own terms: a legacy header's limit, a gRPC
// QuotaFailure's quota.
func (f *Dated) Named(r engine.Result) (engine.Limit, string) {
	if !f.calendar {
		l := f.all.Named(r)
		for i := range f.limits {
			if f.limits[i].Window == l.Window { // the windows of a policy of sliding limits differ
				return l, f.names[i]
			}
		}
		return l, WindowName(l.Window) // not reached: New names one of the policy's
	}
	i := f.at(r.At).named(f.limits, r)
	return f.limits[i], f.names[i]
}

// at returns the fields for a decision taken at t (the zero time: now): the cached ones while t
// is in their periods, else new ones, which replace them.
func (f *Dated) at(t time.Time) *periodFields {
	if t.IsZero() {
		t = time.Now()
	}
	if d := f.current.Load(); d != nil && !t.Before(d.from) && t.Before(d.to) {
		return d
	}
	d := &periodFields{limits: make([]*Fields, len(f.limits)), standIn: make([]string, len(f.limits)),
		windows: make([]time.Duration, len(f.limits))}
	var items [][]string // per policy field, per limit, its item
	first := true
	for i, l := range f.limits {
		lf, window := f.sliding[i], l.Window
		var from, to time.Time
		if l.IsCalendar() {
			from, to = l.PeriodAt(t)
			window = to.Sub(from)
			var err error
			// A valid calendar limit's period is a valid window (1 to 366 days, with clock
			// changes), and the revision is the one the policy's fields were made in.
			if lf, err = New(engine.Policy{{Max: l.Max, Window: window}}, f.version); err != nil {
				panic(fmt.Sprintf("fields: fields of %s for its period %s to %s: %v", l, from, to, err))
			}
			d.standIn[i] = strconv.Quote(WindowName(window))
			if first || from.After(d.from) {
				d.from = from
			}
			if first || to.Before(d.to) {
				d.to = to
			}
			first = false
		}
		d.limits[i], d.windows[i] = lf, window
		for j, pf := range lf.Policy() {
			if j == len(items) {
				items = append(items, make([]string, len(f.limits)))
			}
			if l.IsCalendar() {
				if rest, ok := strings.CutPrefix(pf.Value, d.standIn[i]); ok {
					pf.Value = f.quoted[i] + rest
				}
			}
			items[j][i] = pf.Value
		}
		if l.Max < f.limits[d.fallback].Max || l.Max == f.limits[d.fallback].Max && window < d.windows[d.fallback] {
			d.fallback = i
		}
	}
	for j, pf := range f.all.Policy() {
		d.policy = append(d.policy, Field{Name: pf.Name, Value: strings.Join(items[j], ", ")})
	}
	f.current.Store(d)
	return d
}

// named returns the position in p of the limit r speaks for: the one whose Window (for a
// calendar limit, its current period's length) is r.Window, and whose Max is at least
// r.Remaining; a sliding limit before a calendar one of the same length. A Result that names
// none (one from another policy) gets the limit with the smallest Max.
func (d *periodFields) named(p engine.Policy, r engine.Result) int {
	for _, calendar := range []bool{false, true} {
		for i, l := range p {
			if l.IsCalendar() == calendar && d.windows[i] == r.Window && l.Max >= r.Remaining {
				return i
			}
		}
	}
	return d.fallback
}

// LimitName returns the name the RateLimit fields give the limit l of policy p, so that a
// caller can name it as the fields do. A sliding limit's name is its window, as WindowName
// writes it. A calendar limit's is its period, "day", "week", "month" or "year"; "month-15"
// for a Month with billing day 15 (a billing day of 0 or 1 is the calendar month's); and,
// when another calendar limit of p would have the same name (the same period in another time
// zone), the name followed by "@" and its Location's name: "month@Europe/Berlin". A
// Location's name with a byte outside printable ASCII, a '"', a '\' or a '%' has it written
// as %XX, so that the name is a valid Structured Field String, and the names stay unique
// within the policy.
func LimitName(l engine.Limit, p engine.Policy) string {
	if !l.IsCalendar() {
		return WindowName(l.Window)
	}
	base := calendarBase(l)
	for _, o := range p {
		if o.IsCalendar() && calendarBase(o) == base && o.String() != l.String() {
			return base + "@" + sfSafe(locationName(l.Location))
		}
	}
	return base
}

// calendarBase is a calendar limit's name without its zone: its period and billing day.
func calendarBase(l engine.Limit) string {
	if l.Period == engine.Month && l.BillingDay > 1 {
		return "month-" + strconv.Itoa(l.BillingDay)
	}
	return l.Period.String()
}

// locationName is loc's name, nil being UTC as for the engine.
func locationName(loc *time.Location) string {
	if loc == nil {
		return time.UTC.String()
	}
	return loc.String()
}

// sfSafe writes every byte of s that a Structured Field String cannot hold unescaped as %XX,
// and '%' too, so that different texts stay different.
func sfSafe(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c < 0x20 || c > 0x7e || c == '"' || c == '\\' || c == '%' {
			fmt.Fprintf(&b, "%%%02X", c)
			continue
		}
		b.WriteByte(c)
	}
	return b.String()
}
