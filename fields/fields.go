// Package fields writes the RateLimit-Policy and RateLimit fields of
// draft-ietf-httpapi-ratelimit-headers for an engine.Policy and its decisions, in the syntax of
// a chosen revision of the draft. httplimit sends them as HTTP header fields and grpclimit as
// gRPC header metadata, both through this package, so a client reads the same values from
// either.
//
// In the syntax of draft -10 (the same as -08 and -09), both fields are Structured Field Lists
// (RFC 9651):
//
//	RateLimit-Policy: "1s";q=5;w=1, "1h";q=100;w=3600
//	RateLimit: "1s";r=0;t=1
//
// RateLimit-Policy names every limit of the policy (the name is its window: "500ms", "1s",
// "90m", "1h") with its quota q and its window w in seconds. The draft's w is an integer, so a
// window that is not a whole number of seconds is rounded up: a client pacing itself by q per
// w never sends faster than the limit allows.
//
// RateLimit names one limit, the tightest of the decision (engine.Result.Window: the least
// remaining, the shortest window among equals), with r, its remaining, and t, a delta in seconds
// rounded up so that it is never early. On a denial t is the wait until the request would be
// admitted (engine.Result.RetryAfter); otherwise it is the wait until the named limit next gets
// quota back, when the oldest event in its window leaves it (engine.Result.QuotaAfter), as
// draft -10 defines it ("the number of seconds until additional quota associated with the quota
// policy is made available").
//
// A policy with calendar limits (engine.Calendar) has fields that depend on the date of the
// decision: Dated writes them, naming each calendar limit by its period (LimitName: "month",
// "day") with w the length of the period the decision fell in. New and Fields write the
// fields of a policy of sliding limits, the same for every decision.
//
// The optional parameters (qu, the quota unit; pk, the partition key) are not sent: the unit
// is requests, and a partition key would echo the client's key back to it.
package fields

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/strictrate/strictrate/engine"
)

// Version is the revision of draft-ietf-httpapi-ratelimit-headers whose syntax the fields
// follow.
type Version int

// The revisions this package writes.
const (
	// Draft10 is draft-ietf-httpapi-ratelimit-headers-10 (September 2025), whose syntax -08 and
	// -09 share: RateLimit-Policy with q and w, RateLimit with r and t. The default.
	Draft10 Version = 10
)

// DefaultVersion is the revision httplimit and grpclimit follow unless told otherwise.
const DefaultVersion = Draft10

// String names the revision: "draft-ietf-httpapi-ratelimit-headers-10".
func (v Version) String() string {
	return "draft-ietf-httpapi-ratelimit-headers-" + fmt.Sprintf("%02d", int(v))
}

// syntax is what a revision calls its fields and their parameters. A revision that renames
// them is one more case in Version.syntax; the pending change that renames r and t and adds a
// RateLimit-Partition field is such a case, with the partition field's name (like -10's
// optional pk parameter, it would not carry the client's key).
type syntax struct {
	policyField    string // the field that describes the policy
	rateLimitField string // the field that reports a decision
	quota, window  string // the policy item's parameters
	remaining      string // the decision item's remaining quota
	reset          string // the decision item's delta seconds
}

// syntax returns v's names, and false for a revision this package does not write.
func (v Version) syntax() (syntax, bool) {
	switch v {
	case Draft10:
		return syntax{policyField: "RateLimit-Policy", rateLimitField: "RateLimit",
			quota: "q", window: "w", remaining: "r", reset: "t"}, true
	}
	return syntax{}, false
}

// Field is one header field: its name as the draft writes it ("RateLimit-Policy"; HTTP and
// gRPC metadata compare names without case, and each caller writes the form its protocol
// wants), and its value.
type Field struct {
	Name, Value string
}

// Fields writes the fields of one policy in one revision's syntax. Make it once, with New,
// and use it for every decision: it is safe for concurrent use.
type Fields struct {
	syntax syntax
	policy []Field
	// named holds, per window of the policy, the start of its RateLimit item; fallback names the
	// limit with the smallest quota, for a Result that names none of the policy's windows.
	named    map[time.Duration]namedLimit
	fallback namedLimit
}

// namedLimit is one limit as the RateLimit field names it, prepared once.
type namedLimit struct {
	item  string // `"<name>";r=`
	limit engine.Limit
}

// New prepares the fields of p in v's syntax. The error wraps engine.ErrInvalidArgument for an
// invalid policy (see engine.Policy.Validate) and names a revision it does not write.
func New(p engine.Policy, v Version) (*Fields, error) {
	if err := p.Validate(); err != nil {
		return nil, fmt.Errorf("fields: %w", err)
	}
	s, ok := v.syntax()
	if !ok {
		return nil, fmt.Errorf("fields: %w: no syntax for revision %d of the RateLimit fields draft (known: %d)",
			engine.ErrInvalidArgument, int(v), int(Draft10))
	}
	return build(p, s), nil
}

// build prepares the fields of a valid policy p in syntax s.
func build(p engine.Policy, s syntax) *Fields {
	f := &Fields{syntax: s, named: make(map[time.Duration]namedLimit, len(p))}
	items := make([]string, len(p))
	smallest := 0
	for i, l := range p {
		name := strconv.Quote(WindowName(l.Window))
		items[i] = name + ";" + s.quota + "=" + strconv.Itoa(l.Max) + ";" + s.window + "=" + strconv.FormatInt(Seconds(l.Window), 10)
		f.named[l.Window] = namedLimit{item: name + ";" + s.remaining + "=", limit: l}
		if l.Max < p[smallest].Max || l.Max == p[smallest].Max && l.Window < p[smallest].Window {
			smallest = i
		}
	}
	f.policy = []Field{{Name: s.policyField, Value: strings.Join(items, ", ")}}
	f.fallback = f.named[p[smallest].Window]
	return f
}

// Names returns the name of every field f writes, policy fields first, for callers that
// prepare their protocol's form of each name once.
func (f *Fields) Names() []string {
	return []string{f.syntax.policyField, f.syntax.rateLimitField}
}

// Policy returns the fields that describe the policy: the same on every response, including
// one admitted by a fail-open engine without a decision. The slice is shared: do not modify
// it.
func (f *Fields) Policy() []Field { return f.policy }

// AppendDecision appends to dst the fields that report r, the RateLimit field, and returns
// the extended slice (give it a small array's slice and it need not allocate). It appends
// nothing for a Result a fail-open engine admitted without deciding (r.BackendErr set): there
// is no count to report.
func (f *Fields) AppendDecision(dst []Field, r engine.Result) []Field {
	if r.BackendErr != nil {
		return dst
	}
	named := f.namedLimit(r)
	var buf [64]byte
	b := append(buf[:0], named.item...)
	b = strconv.AppendInt(b, int64(r.Remaining), 10)
	b = append(b, ';')
	b = append(b, f.syntax.reset...)
	b = append(b, '=')
	b = strconv.AppendInt(b, Reset(r), 10)
	return append(dst, Field{Name: f.syntax.rateLimitField, Value: string(b)})
}

// Named returns the limit AppendDecision's fields name for r: the one of r.Window, else (a Result
// from another policy) the policy's limit with the smallest quota.
func (f *Fields) Named(r engine.Result) engine.Limit { return f.namedLimit(r).limit }

func (f *Fields) namedLimit(r engine.Result) namedLimit {
	if named, ok := f.named[r.Window]; ok {
		return named
	}
	return f.fallback
}

// Reset is the t of r's RateLimit field, in seconds rounded up: when denied, the wait until
// the request would be admitted (r.RetryAfter); when admitted, the wait until the named limit
// next gets quota back (r.QuotaAfter).
func Reset(r engine.Result) int64 {
	if r.Allowed {
		return Seconds(r.QuotaAfter)
	}
	return Seconds(r.RetryAfter)
}

// Seconds is d in whole seconds, rounded up, never early; 0 for d <= 0. Retry-After and the
// fields' delta seconds use it.
func Seconds(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return int64((d + time.Second - 1) / time.Second)
}

// WindowName is a window's name in the fields: the largest unit that divides it exactly, "1h",
// "90m", "1s", "500ms", else microseconds ("1500us"), rounded up as the engine rounds windows.
func WindowName(d time.Duration) string {
	for _, u := range []struct {
		unit time.Duration
		name string
	}{{time.Hour, "h"}, {time.Minute, "m"}, {time.Second, "s"}, {time.Millisecond, "ms"}} {
		if d%u.unit == 0 {
			return strconv.FormatInt(int64(d/u.unit), 10) + u.name
		}
	}
	return strconv.FormatInt(int64((d+time.Microsecond-1)/time.Microsecond), 10) + "us"
}
