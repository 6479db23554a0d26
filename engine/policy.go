package engine

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// MaxPolicyLimits is the most limits a Policy may hold. The log keeps a cursor per window
// shorter than its longest, which each decision moves (amortized O(1)) and the header stores;
// a handful covers every sensible stacking (per second, minute, hour, day).
const MaxPolicyLimits = 16

// Policy is a set of limits on one key that must all hold at once, such as "5 per second and
// 100 per hour": a request is admitted only when every limit admits it, and then it
// counts against all of them. A sliding window log answers every window from the same entries,
// so a Policy costs one log and one script call, however many limits it holds.
//
// A valid Policy has 1 to MaxPolicyLimits valid limits, no two with the same Window. The key's
// log holds at most the Max of the longest window in events (a shorter window with a larger
// Max than a longer one never binds, and is allowed).
type Policy []Limit

// Validate reports whether p is a valid Policy; the error wraps ErrInvalidArgument and names
// the bad value. Use it to check a Policy once at start-up (the httplimit middleware does).
func (p Policy) Validate() error {
	return p.validate(1)
}

// validate checks the policy and the cost n of a request against every limit.
func (p Policy) validate(n int) error {
	switch {
	case len(p) == 0:
		return fmt.Errorf("%w: empty policy", ErrInvalidArgument)
	case len(p) > MaxPolicyLimits:
		return fmt.Errorf("%w: policy has %d limits, more than %d", ErrInvalidArgument, len(p), MaxPolicyLimits)
	}
	for i, l := range p {
		if err := l.validate(n); err != nil {
			return fmt.Errorf("policy limit %d (%s): %w", i, l, err)
		}
		for j := range i {
			switch {
			case l.IsCalendar() != p[j].IsCalendar():
			case l.IsCalendar() && p[j].calendarTag() == l.calendarTag():
				return fmt.Errorf("%w: policy limits %d (%s) and %d (%s) have the same period",
					ErrInvalidArgument, j, p[j], i, l)
			case !l.IsCalendar() && p[j].windowMicros() == l.windowMicros():
				return fmt.Errorf("%w: policy limits %d (%s) and %d (%s) have the same window",
					ErrInvalidArgument, j, p[j], i, l)
			}
		}
	}
	return nil
}

// String returns the limits joined by " and ", for logs and errors: "5/1s and 100/1h0m0s".
func (p Policy) String() string {
	parts := make([]string, len(p))
	for i, l := range p {
		parts[i] = l.String()
	}
	return strings.Join(parts, " and ")
}

// Tag returns a compact name of p's limits, the same for the same limits in any order, for
// keys: each limit as max/window in microseconds, by ascending window, joined by commas
// ("5/3600000000,100/60000000"); a Resolution follows its window after "~" (in
// microseconds), and calendar limits come last, named by period and zone
// ("1000000/month@UTC"). The middlewares put it in their keys, so that requests judged
// by different policies never share a log (see "Limits that share a key" in docs/limits.md).
func (p Policy) Tag() string {
	sorted := slices.Clone(p)
	slices.SortFunc(sorted, compareLimits)
	parts := make([]string, len(sorted))
	for i, l := range sorted {
		switch {
		case l.IsCalendar():
			parts[i] = strconv.Itoa(l.Max) + "/" + l.calendarTag()
		case l.Resolution > 0:
			parts[i] = strconv.Itoa(l.Max) + "/" + strconv.FormatInt(l.windowMicros(), 10) + "~" + strconv.FormatInt(ceilMicros(l.Resolution), 10)
		default:
			parts[i] = strconv.Itoa(l.Max) + "/" + strconv.FormatInt(l.windowMicros(), 10)
		}
	}
	return strings.Join(parts, ",")
}

// Longest returns the sliding limit of p with the longest window; the zero Limit when p holds
// none. Its window is how long a key of p keeps its entries: size what a caller keeps beside
// the key (a cache of its Results, the TTL of a record of who hit it) by it. A calendar limit
// keeps its key until its period ends (Limit.PeriodAt).
func (p Policy) Longest() Limit {
	var longest Limit
	for _, l := range p {
		if l.Window > longest.Window {
			longest = l
		}
	}
	return longest
}

// checkPolicyCall checks a call for n events of key against p before anything is sent (the
// context, the key, and p with cost n), and returns p's limit set.
func (e *Engine) checkPolicyCall(ctx context.Context, key string, p Policy, n int) (*limitSet, error) {
	if err := checkContext(ctx); err != nil {
		return nil, err
	}
	if err := validateKey(key); err != nil {
		return nil, err
	}
	return e.checkedPolicy(p, n)
}

// checkedPolicy checks p with the cost n and returns its limit set. A policy in the engine's
// cache was valid when it went in: only n is checked against it.
func (e *Engine) checkedPolicy(p Policy, n int) (*limitSet, error) {
	var s *limitSet
	switch len(p) {
	case 0:
	case 1:
		s = e.cachedLimit(p[0])
	default:
		s = e.cachedPolicy(p)
	}
	if s != nil && n >= 1 && n <= s.maxCost {
		return s, nil
	}
	if err := p.validate(n); err != nil {
		return nil, err
	}
	return e.policySet(p), nil
}

// compareLimits orders limits as the scripts take them: sliding ones by window (then max,
// then resolution), then calendar ones by their tag (then max).
func compareLimits(a, b Limit) int {
	switch {
	case a.IsCalendar() != b.IsCalendar():
		if a.IsCalendar() {
			return 1
		}
		return -1
	case a.IsCalendar():
		return cmp.Or(cmp.Compare(a.calendarTag(), b.calendarTag()), cmp.Compare(a.Max, b.Max))
	}
	return cmp.Or(cmp.Compare(a.Window, b.Window), cmp.Compare(a.Max, b.Max), cmp.Compare(a.Resolution, b.Resolution))
}
