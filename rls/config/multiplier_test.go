package config_test

import (
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/strictrate/strictrate/rls/config"
)

// unit_multiplier (this service's key, the name of Envoy's newer API): an integer of 1 or
// more makes a rule's window that many units; 0, null or none is one unit; the rule keeps it
// as UnitMultiplier (0 for one unit), and /rlconfig shows it.
func TestUnitMultiplier(t *testing.T) {
	c := parse(t, yamlFile("multiplier.yaml", `domain: d
descriptors:
  - {key: two_seconds, rate_limit: {unit: second, unit_multiplier: 2, requests_per_unit: 3}}
  - {key: thirty_seconds, rate_limit: {unit: SECOND, unit_multiplier: 30, requests_per_unit: 100}}
  - {key: fortnight, rate_limit: {unit: week, unit_multiplier: 2, requests_per_unit: 5}}
  - {key: quarter, rate_limit: {unit: month, unit_multiplier: 3, requests_per_unit: 5}}
  - {key: one, rate_limit: {unit: minute, unit_multiplier: 1, requests_per_unit: 5}}
  - {key: zero, rate_limit: {unit: minute, unit_multiplier: 0, requests_per_unit: 5}}
  - {key: nil, rate_limit: {unit: minute, unit_multiplier: null, requests_per_unit: 5}}
  - {key: none, rate_limit: {unit: minute, requests_per_unit: 5}}
  - {key: hex, rate_limit: {unit: minute, unit_multiplier: 0x10, requests_per_unit: 5}}
`))
	for _, tc := range []struct {
		key        string
		multiplier uint32
		units      uint32
		window     time.Duration
	}{
		{"two_seconds", 2, 2, 2 * time.Second},
		{"thirty_seconds", 30, 30, 30 * time.Second},
		{"fortnight", 2, 2, 14 * 24 * time.Hour},
		{"quarter", 3, 3, 90 * 24 * time.Hour},
		{"one", 0, 1, time.Minute},
		{"zero", 0, 1, time.Minute},
		{"nil", 0, 1, time.Minute},
		{"none", 0, 1, time.Minute},
		{"hex", 16, 16, 16 * time.Minute},
	} {
		m := c.Match("d", e(tc.key, "v"))
		if m.Limit == nil {
			t.Fatalf("%s: no rule", tc.key)
		}
		if l := m.Limit; l.UnitMultiplier != tc.multiplier || l.Units() != tc.units || l.Window() != tc.window {
			t.Errorf("%s: UnitMultiplier %d, Units %d, Window %s; want %d, %d, %s",
				tc.key, l.UnitMultiplier, l.Units(), l.Window(), tc.multiplier, tc.units, tc.window)
		}
	}
	for _, line := range []string{
		"d.two_seconds: unit=SECOND unit_multiplier=2 requests_per_unit=3, shadow_mode: false, quota_mode: false\n",
		"d.quarter: unit=MONTH unit_multiplier=3 requests_per_unit=5, shadow_mode: false, quota_mode: false\n",
		"d.one: unit=MINUTE requests_per_unit=5, shadow_mode: false, quota_mode: false\n",
	} {
		if !strings.Contains(c.String(), line) {
			t.Errorf("String has no line %q:\n%s", line, c)
		}
	}
	// A rule without one, and an override, are of one unit.
	if o := c.Override("d", e("k", "v"), 5, config.Hour); o.Limit.Units() != 1 || o.Limit.Window() != time.Hour {
		t.Errorf("an override: Units %d, Window %s", o.Limit.Units(), o.Limit.Window())
	}
	if w := (&config.RateLimit{Unlimited: true}).Window(); w != 0 {
		t.Errorf("an unlimited rule's Window is %s, want 0", w)
	}
}

// A unit_multiplier that is not an integer of 1 or more (0 is one unit), beside unlimited,
// outside a rate_limit, making a window longer than the engine's longest, or, under
// WithCalendar, above 1 on a calendar unit, is refused at load, naming the file, the line and
// the rule.
func TestUnitMultiplierRejects(t *testing.T) {
	rule := func(rateLimit string) string {
		return "domain: d\ndescriptors:\n  - key: k\n    descriptors:\n      - key: sub\n        rate_limit: " + rateLimit + "\n"
	}
	const notUnits = "' is not a whole number of units: write an integer of 1 or more (0, or none, is one unit)"
	cases := []struct {
		name     string
		yaml     string
		calendar bool
		line     int
		reason   string
	}{
		{name: "negative", yaml: rule("{unit: second, unit_multiplier: -2, requests_per_unit: 3}"),
			line: 6, reason: "unit_multiplier -2 of 'd.k.sub" + notUnits},
		{name: "a fraction", yaml: rule("{unit: second, unit_multiplier: 1.5, requests_per_unit: 3}"),
			line: 6, reason: "unit_multiplier 1.5 of 'd.k.sub" + notUnits},
		{name: "a quoted number", yaml: rule("{unit: second, unit_multiplier: '30', requests_per_unit: 3}"),
			line: 6, reason: "unit_multiplier '30' of 'd.k.sub" + notUnits},
		{name: "a word", yaml: rule("{unit: second, unit_multiplier: thirty, requests_per_unit: 3}"),
			line: 6, reason: "unit_multiplier thirty of 'd.k.sub" + notUnits},
		{name: "a boolean", yaml: rule("{unit: second, unit_multiplier: true, requests_per_unit: 3}"),
			line: 6, reason: "unit_multiplier true of 'd.k.sub" + notUnits},
		{name: "a list", yaml: rule("{unit: second, unit_multiplier: [2], requests_per_unit: 3}"),
			line: 6, reason: "unit_multiplier a list of 'd.k.sub" + notUnits},
		{name: "on its own line", yaml: "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: minute\n      requests_per_unit: 3\n      unit_multiplier: -1\n",
			line: 7, reason: "unit_multiplier -1 of 'd.k" + notUnits},
		{name: "beside unlimited", yaml: rule("{unlimited: true, unit_multiplier: 2}"),
			line: 6, reason: "should not specify unit_multiplier when unlimited ('d.k.sub')"},
		{name: "beside the descriptor's key", yaml: "domain: d\ndescriptors:\n  - key: k\n    unit_multiplier: 30\n    rate_limit: {unit: second, requests_per_unit: 3}\n",
			line: 4, reason: "unit_multiplier is beside the descriptor's key: it belongs in the rule's rate_limit, beside its unit"},
		{name: "beside the domain", yaml: "domain: d\nunit_multiplier: 30\ndescriptors:\n  - key: k\n",
			line: 2, reason: "unit_multiplier is beside the domain: it belongs in the rule's rate_limit, beside its unit"},
		{name: "longer than the longest window", yaml: rule("{unit: year, unit_multiplier: 36, requests_per_unit: 3}"),
			line: 6, reason: "unit_multiplier 36 of 'd.k.sub' makes a window of 36 years, longer than the longest a rule can have (engine.MaxWindow, about 35 years)"},
		{name: "beyond 32 bits", yaml: rule("{unit: second, unit_multiplier: 99999999999, requests_per_unit: 3}"),
			line: 6, reason: "unit_multiplier 99999999999 of 'd.k.sub' makes a window of 99999999999 seconds, longer than the longest a rule can have (engine.MaxWindow, about 35 years)"},
		{name: "months under calendar periods", calendar: true, yaml: rule("{unit: month, unit_multiplier: 3, requests_per_unit: 3}"),
			line: 6, reason: "unit_multiplier 3 of 'd.k.sub': under calendar periods (STRICTRATE_CALENDAR=true) a month is one calendar month, counted from its start to the next, and 3 of them cannot be counted as one; remove unit_multiplier, or turn calendar periods off to make it a sliding window of 3 months"},
		{name: "days under calendar periods", calendar: true, yaml: rule("{unit: day, unit_multiplier: 7, requests_per_unit: 3}"),
			line: 6, reason: "unit_multiplier 7 of 'd.k.sub': under calendar periods (STRICTRATE_CALENDAR=true) a day is one calendar day, counted from its start to the next, and 7 of them cannot be counted as one; remove unit_multiplier, or turn calendar periods off to make it a sliding window of 7 days"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c, err := config.Parse([]config.File{yamlFile("f.yaml", tc.yaml)}, config.WithCalendar(tc.calendar))
			if err == nil {
				t.Fatalf("Parse accepted it:\n%s", c)
			}
			var ce *config.Error
			if !errors.Is(err, config.ErrInvalid) || !errors.As(err, &ce) {
				t.Fatalf("error %v is not an *Error wrapping ErrInvalid", err)
			}
			if ce.File != "f.yaml" || ce.Line != tc.line || ce.Reason != tc.reason {
				t.Errorf("refused as %s, %d, %q\n  want f.yaml, %d, %q", ce.File, ce.Line, ce.Reason, tc.line, tc.reason)
			}
		})
	}
}

// Under WithCalendar, a calendar unit of one period (unit_multiplier 0 or 1) and a unit
// without a calendar of several are accepted.
func TestUnitMultiplierCalendarAccepts(t *testing.T) {
	c, err := config.Parse([]config.File{yamlFile("f.yaml", `domain: d
descriptors:
  - {key: month, rate_limit: {unit: month, unit_multiplier: 1, requests_per_unit: 3}}
  - {key: day, rate_limit: {unit: day, unit_multiplier: 0, requests_per_unit: 3}}
  - {key: hours, rate_limit: {unit: hour, unit_multiplier: 48, requests_per_unit: 3}}
`)}, config.WithCalendar(true))
	if err != nil {
		t.Fatal(err)
	}
	if l := c.Match("d", e("hours", "x")).Limit; l == nil || l.Window() != 48*time.Hour {
		t.Errorf("48 hours: %+v", l)
	}
}

// LoadDir and Watch (WatchOptions.Calendar) refuse a multiplied calendar unit under
// calendar periods, and accept it without.
func TestUnitMultiplierCalendarLoads(t *testing.T) {
	root := t.TempDir()
	dir := filepath.Join(root, "config")
	write(t, filepath.Join(dir, "f.yaml"), "domain: d\ndescriptors:\n  - {key: k, rate_limit: {unit: week, unit_multiplier: 2, requests_per_unit: 3}}\n")
	if _, err := config.LoadDir(dir, false); err != nil {
		t.Fatalf("LoadDir without calendar periods: %v", err)
	}
	if _, err := config.LoadDir(dir, false, config.WithCalendar(true)); !errors.Is(err, config.ErrInvalid) {
		t.Fatalf("LoadDir with calendar periods: %v, want a refusal", err)
	}
	startWatch(t, config.WatchOptions{Root: root, AppDirectory: "config", Calendar: true}).waitInvalid(t)
	startWatch(t, config.WatchOptions{Root: root, AppDirectory: "config"}).waitRPU(t, "d", 3)
}
