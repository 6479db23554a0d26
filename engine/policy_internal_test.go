package engine

import (
	"errors"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/strictrate/strictrate/scripts"
)

func TestPolicyValidateNamesWhatIsWrong(t *testing.T) {
	ok := []Policy{
		{PerSecond(5)},
		{PerSecond(5), PerHour(100)},
		{PerHour(100), PerSecond(5)}, // any order
		{{Max: 100, Window: time.Second}, {Max: 10, Window: time.Hour}},    // a never-binding limit is allowed
		{{Max: 1, Window: MinWindow}, {Max: MaxEvents, Window: MaxWindow}}, // the extremes
		{{Max: 1, Window: time.Millisecond}, {Max: 1, Window: time.Millisecond + time.Microsecond}},
	}
	for _, p := range ok {
		if err := p.Validate(); err != nil {
			t.Errorf("Validate(%s) = %v, want nil", p, err)
		}
	}
	full := make(Policy, MaxPolicyLimits)
	for i := range full {
		full[i] = Limit{Max: 1, Window: time.Duration(i+1) * time.Second}
	}
	if err := full.Validate(); err != nil {
		t.Errorf("a policy of MaxPolicyLimits limits: %v", err)
	}
	bad := []struct {
		p    Policy
		n    int
		says string
	}{
		{nil, 1, "empty policy"},
		{append(full, Limit{Max: 1, Window: time.Hour}), 1, "17 limits"},
		{Policy{PerSecond(5), {Max: 0, Window: time.Hour}}, 1, "limit 1 (0/1h0m0s)"},
		{Policy{PerSecond(5), {Max: 3, Window: time.Second}}, 1, "same window"},
		{Policy{{Max: 3, Window: time.Millisecond + 1}, {Max: 3, Window: time.Millisecond + 999}}, 1, "same window"},
		{Policy{PerSecond(5), PerHour(3)}, 4, "above the limit's Max 3"},
		{Policy{PerSecond(5), PerHour(3)}, 0, "cost n 0"},
	}
	for _, tc := range bad {
		err := tc.p.validate(tc.n)
		if !errors.Is(err, ErrInvalidArgument) || !strings.Contains(err.Error(), tc.says) {
			t.Errorf("validate(%s, %d) = %v, want ErrInvalidArgument saying %q", tc.p, tc.n, err, tc.says)
		}
	}
}

func TestPolicyLongestAndStringNameItsLimits(t *testing.T) {
	p := Policy{PerSecond(5), PerHour(100), PerMinute(30)}
	if got := p.Longest(); got != PerHour(100) {
		t.Errorf("Longest = %s, want 100/1h0m0s", got)
	}
	if got := (Policy{}).Longest(); got != (Limit{}) {
		t.Errorf("Longest of an empty policy = %s, want the zero Limit", got)
	}
	if got, want := p.String(), "5/1s and 100/1h0m0s and 30/1m0s"; got != want {
		t.Errorf("String = %q, want %q", got, want)
	}
}

// A policy's tag names its limits whatever their order, and tells different limits apart.
func TestPolicyTagIgnoresTheLimitsOrder(t *testing.T) {
	a, b := Limit{Max: 5, Window: time.Hour}, Limit{Max: 100, Window: time.Minute}
	if got, want := (Policy{a, b}).Tag(), "100/60000000,5/3600000000"; got != want {
		t.Fatalf("Tag = %q, want %q", got, want)
	}
	if (Policy{b, a}).Tag() != (Policy{a, b}).Tag() {
		t.Fatalf("the same limits in another order: tags %q and %q, want one", (Policy{b, a}).Tag(), (Policy{a, b}).Tag())
	}
	if (Policy{a}).Tag() == (Policy{{Max: 6, Window: time.Hour}}).Tag() || (Policy{a}).Tag() == (Policy{a, b}).Tag() {
		t.Fatal("different policies share a tag, want a tag each")
	}
}

// The log keeps a cursor for every window a policy may count at once: lib_log.lua's
// MAX_CURSORS is MaxPolicyLimits.
func TestLogKeepsACursorPerPolicyLimit(t *testing.T) {
	m := regexp.MustCompile(`(?m)^--const MAX_CURSORS (\d+)$`).FindStringSubmatch(scripts.Source("decide"))
	if m == nil {
		t.Fatal("lib_log.lua defines no MAX_CURSORS")
	}
	if got, _ := strconv.Atoi(m[1]); got != MaxPolicyLimits {
		t.Fatalf("lib_log.lua's MAX_CURSORS is %d, want MaxPolicyLimits %d", got, MaxPolicyLimits)
	}
}
