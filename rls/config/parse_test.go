package config_test

import (
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/strictrate/strictrate/engine"
	"github.com/strictrate/strictrate/rls/config"
)

func TestParseRejects(t *testing.T) {
	const okFile = "domain: test-domain\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 1}\n"
	cases := []struct {
		name   string
		files  []config.File
		merge  bool
		file   string // the file named; the last one when empty
		line   int
		reason string // exact, or a prefix when it ends in "..."
	}{
		{name: "empty domain", files: []config.File{yamlFile("f.yaml", "descriptors:\n")},
			reason: "config file cannot have empty domain"},
		{name: "empty file", files: []config.File{yamlFile("f.yaml", "")},
			reason: "config file cannot have empty domain"},
		{name: "duplicate domain", files: []config.File{yamlFile("a.yaml", okFile), yamlFile("b.yaml", "domain: test-domain\ndescriptors:\n")},
			line: 1, reason: "duplicate domain 'test-domain' in config file"},
		{name: "duplicate key in merged domain", merge: true,
			files: []config.File{yamlFile("a.yaml", okFile), yamlFile("b.yaml", okFile)},
			line:  3, reason: "duplicate descriptor composite key 'test-domain.a'"},
		{name: "empty key", files: []config.File{yamlFile("f.yaml", "domain: test-domain\ndescriptors:\n  - value: value1\n")},
			line: 3, reason: "descriptor has empty key"},
		{name: "duplicate key", files: []config.File{yamlFile("f.yaml", `domain: test-domain
descriptors:
  - key: key1
    value: value1
  - key: key1
    value: value1
`)}, line: 5, reason: "duplicate descriptor composite key 'test-domain.key1_value1'"},
		{name: "duplicate nested key", files: []config.File{yamlFile("f.yaml", `domain: test-domain
descriptors:
  - key: a
    descriptors:
      - key: b
      - key: b
`)}, line: 6, reason: "duplicate descriptor composite key 'test-domain.a.b'"},
		{name: "composite keys collide", files: []config.File{yamlFile("f.yaml", `domain: test-domain
descriptors:
  - key: a
    value: b_c
  - key: a_b
    value: c
`)}, line: 5, reason: "duplicate descriptor composite key 'test-domain.a_b_c'"},
		{name: "bad unit", files: []config.File{yamlFile("f.yaml", `domain: test-domain
descriptors:
  - key: key1
    value: value1
    rate_limit:
      unit: foo
      requests_per_unit: 5
`)}, line: 6, reason: "invalid rate limit unit 'foo'"},
		{name: "no unit", files: []config.File{yamlFile("f.yaml", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {requests_per_unit: 5}\n")},
			line: 4, reason: "invalid rate limit unit ''"},
		{name: "empty rate_limit", files: []config.File{yamlFile("f.yaml", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {}\n")},
			line: 4, reason: "invalid rate limit unit ''"},
		{name: "unit unknown", files: []config.File{yamlFile("f.yaml", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: unknown, requests_per_unit: 1}\n")},
			line: 4, reason: "invalid rate limit unit 'unknown'"},
		{name: "unlimited with unit", files: []config.File{yamlFile("f.yaml", `domain: test-domain
descriptors:
  - key: foo
    rate_limit:
      unlimited: true
      unit: day
      requests_per_unit: 25
`)}, line: 5, reason: "should not specify rate limit unit when unlimited"},
		{name: "replaces without a name", files: []config.File{yamlFile("f.yaml", `domain: test-domain
descriptors:
  - key: key1
    descriptors:
      - key: subkey1
        rate_limit:
          name: self
          replaces:
            - name:
          unit: second
          requests_per_unit: 5
`)}, line: 7, reason: "should not have an empty replaces entry"},
		{name: "replaces naming itself", files: []config.File{yamlFile("f.yaml", `domain: test-domain
descriptors:
  - key: key1
    rate_limit:
      name: self
      replaces:
        - name: other
        - name: self
      unit: second
      requests_per_unit: 5
`)}, line: 5, reason: "replaces should not contain name of same descriptor"},
		{name: "share_threshold without wildcard", files: []config.File{yamlFile("f.yaml", `domain: d
descriptors:
  - key: files
    value: files
    share_threshold: true
    rate_limit: {unit: minute, requests_per_unit: 1}
`)}, line: 3, reason: "share_threshold can only be used with wildcard values (containing '*'), but found key 'files_files'"},
		{name: "unknown key", files: []config.File{yamlFile("f.yaml", `domain: test-domain
descriptors:
  - key: key1
    value: value1
    ratelimit:
      unit: day
      requests_per_unit: 5
`)}, line: 5, reason: "config error, unknown key 'ratelimit'"},
		{name: "unknown nested key", files: []config.File{yamlFile("f.yaml", `domain: test-domain
descriptors:
  - key: key1
    rate_limit:
      unit: day
      requestsperunit: 5
`)}, line: 6, reason: "config error, unknown key 'requestsperunit'"},
		{name: "non-string key", files: []config.File{yamlFile("f.yaml", "0.25: test-domain\ndescriptors:\n")},
			line: 1, reason: "config error, key is not of type string: 0.25"},
		{name: "boolean key", files: []config.File{yamlFile("f.yaml", "domain: d\ntrue: 1\n")},
			line: 2, reason: "config error, key is not of type string: true"},
		{name: "list of strings", files: []config.File{yamlFile("f.yaml", "domain: test-domain\ndescriptors:\n  - a\n  - b\n")},
			line: 3, reason: "config error, yaml file contains list of type other than map: a"},
		{name: "list with an empty item", files: []config.File{yamlFile("f.yaml", "domain: d\ndescriptors:\n  -\n")},
			reason: "config error, yaml file contains list of type other than map: <nil>"},
		{name: "bad yaml", files: []config.File{yamlFile("f.yaml", "'''\n")},
			reason: "error loading config file: yaml: line 2: found unexpected end of stream"},
		{name: "document is a list", files: []config.File{yamlFile("f.yaml", "- domain: d\n")},
			line: 1, reason: "error loading config file: cannot unmarshal !!seq into a map"},
		{name: "text file", files: []config.File{yamlFile("README", "Rate limits live here.\n")},
			line: 1, reason: "error loading config file: cannot unmarshal !!str `Rate limits live here.` into a map"},
		{name: "float", files: []config.File{yamlFile("f.yaml", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1.5}\n")},
			line: 4, reason: "error checking config..."},
		{name: "negative requests_per_unit", files: []config.File{yamlFile("f.yaml", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: -1}\n")},
			line: 4, reason: "error loading config file: cannot unmarshal !!int `-1` into uint32"},
		{name: "requests_per_unit over 32 bits", files: []config.File{yamlFile("f.yaml", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 4294967296}\n")},
			line: 4, reason: "error loading config file: cannot unmarshal !!int `4294967296` into uint32"},
		{name: "requests_per_unit over the engine's largest limit", files: []config.File{yamlFile("f.yaml", `domain: d
descriptors:
  - key: k
    descriptors:
      - key: bulk
        rate_limit:
          unit: minute
          requests_per_unit: 4294967295
`)}, line: 8, reason: "requests_per_unit 4294967295 of 'd.k.bulk' is more than 2147483647, the most a rule can limit exactly; lower it, or use unlimited: true for no limit"},
		{name: "requests_per_unit one over", files: []config.File{yamlFile("f.yaml", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 2147483648}\n")},
			line: 4, reason: "requests_per_unit 2147483648 of 'd.k' is more than 2147483647, the most a rule can limit exactly; lower it, or use unlimited: true for no limit"},
		{name: "quoted number", files: []config.File{yamlFile("f.yaml", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: '5'}\n")},
			line: 4, reason: "error loading config file: cannot unmarshal !!str `5` into uint32"},
		{name: "quoted boolean", files: []config.File{yamlFile("f.yaml", "domain: d\ndescriptors:\n  - key: k\n    shadow_mode: \"true\"\n")},
			line: 4, reason: "error loading config file: cannot unmarshal !!str `true` into bool"},
		{name: "descriptors as a map", files: []config.File{yamlFile("f.yaml", "domain: d\ndescriptors:\n  key: k\n")},
			line: 3, reason: "error loading config file: cannot unmarshal !!map into a list of descriptors"},
		{name: "domain as a list", files: []config.File{yamlFile("f.yaml", "domain: [{key: a}]\n")},
			line: 1, reason: "error loading config file: cannot unmarshal !!seq into string"},
		{name: "alias containing itself", files: []config.File{yamlFile("f.yaml", "domain: d\ndescriptors: &a\n  - key: k\n    descriptors: *a\n")},
			reason: "error loading config file: maps nested more than 256 deep"},
		{name: "metadata that is not a map", files: []config.File{yamlFile("f.yaml", "domain: d\ndescriptors:\n  - key: k\n    metadata: [a, b]\n")},
			line: 4, reason: "error loading config file: cannot unmarshal !!seq into a metadata map"},
		{name: "metadata holding binary that is not text", files: []config.File{yamlFile("f.yaml", "domain: d\ndescriptors:\n  - key: k\n    metadata: {b: !!binary /w==}\n")},
			line: 4, reason: "error parsing metadata: a binary value is not UTF-8 text"},
		{name: "the first bad file is named", files: []config.File{yamlFile("a.yaml", "domain: a\nunknown: 1\n"), yamlFile("b.yaml", "x: 1\n")},
			file: "a.yaml", line: 2, reason: "config error, unknown key 'unknown'"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var opts []config.Option
			if tc.merge {
				opts = append(opts, config.WithMergeDomains(true))
			}
			c, err := config.Parse(tc.files, opts...)
			if err == nil {
				t.Fatalf("Parse accepted it: %s", c)
			}
			if !errors.Is(err, config.ErrInvalid) {
				t.Fatalf("error %v does not wrap ErrInvalid", err)
			}
			var ce *config.Error
			if !errors.As(err, &ce) {
				t.Fatalf("error %T is not an *Error", err)
			}
			file := tc.file
			if file == "" {
				file = tc.files[len(tc.files)-1].Name
			}
			if ce.File != file {
				t.Errorf("File = %q, want %q", ce.File, file)
			}
			if tc.line != 0 && ce.Line != tc.line {
				t.Errorf("Line = %d, want %d (%v)", ce.Line, tc.line, err)
			}
			if prefix, ok := strings.CutSuffix(tc.reason, "..."); ok {
				if !strings.HasPrefix(ce.Reason, prefix) {
					t.Errorf("Reason = %q, want it to start with %q", ce.Reason, prefix)
				}
			} else if ce.Reason != tc.reason {
				t.Errorf("Reason = %q, want %q", ce.Reason, tc.reason)
			}
			if !strings.HasPrefix(err.Error(), "config: "+file+": ") {
				t.Errorf("message %q does not name the file", err)
			}
		})
	}
}

// A descriptor's metadata (the reference's newer format) is any map, its keys not checked
// against the known ones, kept with its rule as the reference keeps it; anywhere else it is
// accepted and ignored, as every known key is.
func TestParseMetadata(t *testing.T) {
	c := parse(t, yamlFile("metadata.yaml", `
domain: d
metadata: {ignored: at the top}
descriptors:
  - key: k
    metadata: &meta
      service: {name: svc, ratelimit: [1, 2.5, yes, "yes", ~, 2026-01-02]}
      <<: {merged: true}
    rate_limit: {unit: minute, requests_per_unit: 1, metadata: ignored}
  - key: alias
    metadata: *meta
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: empty
    metadata: {}
    rate_limit: {unit: minute, requests_per_unit: 1}
`))
	want := map[string]any{
		"service": map[string]any{"name": "svc", "ratelimit": []any{1.0, 2.5, true, "yes", nil, "2026-01-02"}},
		"merged":  true,
	}
	for _, key := range []string{"k", "alias"} {
		m := c.Match("d", e(key, "x"))
		if m.Limit == nil || m.Limit.Metadata == nil || !reflect.DeepEqual(m.Limit.Metadata.AsMap(), want) {
			t.Errorf("%s's metadata = %v, want %v", key, m.Limit, want)
		}
	}
	if m := c.Match("d", e("empty", "x")); m.Limit == nil || m.Limit.Metadata != nil {
		t.Errorf("an empty metadata map is kept: %v", m.Limit)
	}
}

// TestParseAcceptsAsTheReference covers what the reference accepts that a stricter reader
// would refuse.
func TestParseAcceptsAsTheReference(t *testing.T) {
	c := parse(t, yamlFile("quirks.yaml", `
domain: d
unit: ignored at the top, as every known key is anywhere
descriptors:
  - key: last_wins
    rate_limit:
      unit: second
      requests_per_unit: 1
      requests_per_unit: 2
  - key: yaml11
    shadow_mode: yes
    detailed_metric: off
    rate_limit: {unit: MINUTE, requests_per_unit: 0x10}
  - key: mixed_case
    rate_limit: {unit: Hour, requests_per_unit: 3}
  - key: null_rate_limit
    rate_limit:
  - key: no_requests_per_unit
    rate_limit: {unit: day}
  - key: unlimited_bad_unit
    rate_limit: {unlimited: true, unit: foo, requests_per_unit: 7}
  - key: largest
    rate_limit: {unit: minute, requests_per_unit: 2147483647}
  - key: unlimited_huge
    rate_limit: {unlimited: true, requests_per_unit: 4294967295}
  - key: 123
    value: true
    rate_limit: &shared {unit: week, requests_per_unit: 4}
  - key: alias
    rate_limit: *shared
  - key: merged
    rate_limit:
      <<: *shared
      requests_per_unit: 9
  - key: date
    value: 2001-12-14
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: wrong_place
    unit: minute
    name: ignored
    rate_limit: {unit: second, requests_per_unit: 1, replaces: [{name: other}]}
  - key: star
    value: "*"
    share_threshold: true
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: keyonly*
    share_threshold: true
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: empty_children
    descriptors:
    rate_limit: {unit: second, requests_per_unit: 1}
---
this: second document is not read
`))
	runMatches(t, c, []matchCase{
		{name: "a key given twice: the last wins", domain: "d", entries: e("last_wins", "x"),
			want: &want{rpu: 2, unit: config.Second, statKey: "d.last_wins"}},
		{name: "YAML 1.1 booleans, hex, upper-case unit", domain: "d", entries: e("yaml11", "x"),
			want: &want{rpu: 16, unit: config.Minute, statKey: "d.yaml11", shadow: true}},
		{name: "mixed-case unit", domain: "d", entries: e("mixed_case", "x"),
			want: &want{rpu: 3, unit: config.Hour, statKey: "d.mixed_case"}},
		{name: "rate_limit: null is no rate limit", domain: "d", entries: e("null_rate_limit", "x")},
		{name: "requests_per_unit defaults to 0", domain: "d", entries: e("no_requests_per_unit", "x"),
			want: &want{rpu: 0, unit: config.Day, statKey: "d.no_requests_per_unit"}},
		{name: "unlimited with a unit that is not one", domain: "d", entries: e("unlimited_bad_unit", "x"),
			want: &want{unlimited: true, rpu: 7, statKey: "d.unlimited_bad_unit"}},
		{name: "the largest requests_per_unit", domain: "d", entries: e("largest", "x"),
			want: &want{rpu: config.MaxRequestsPerUnit, unit: config.Minute, statKey: "d.largest"}},
		{name: "unlimited: requests_per_unit is not read", domain: "d", entries: e("unlimited_huge", "x"),
			want: &want{unlimited: true, rpu: 4294967295, statKey: "d.unlimited_huge"}},
		{name: "scalars as strings", domain: "d", entries: e("123", "true"),
			want: &want{rpu: 4, unit: config.Week, statKey: "d.123_true"}},
		{name: "alias", domain: "d", entries: e("alias", "x"),
			want: &want{rpu: 4, unit: config.Week, statKey: "d.alias"}},
		{name: "merge key", domain: "d", entries: e("merged", "x"),
			want: &want{rpu: 9, unit: config.Week, statKey: "d.merged"}},
		{name: "timestamp as a string", domain: "d", entries: e("date", "2001-12-14"),
			want: &want{rpu: 1, unit: config.Second, statKey: "d.date_2001-12-14"}},
		{name: "known keys in the wrong place are ignored", domain: "d", entries: e("wrong_place", "x"),
			want: &want{rpu: 1, unit: config.Second, statKey: "d.wrong_place"}},
		{name: "shared '*'", domain: "d", entries: e("star", "anything"),
			want: &want{rpu: 1, unit: config.Second, statKey: "d.star_*", counter: e("star", "*")}},
		{name: "a wildcard key without a value", domain: "d", entries: e("keyonly", "v"),
			want: &want{rpu: 1, unit: config.Second, statKey: "d.keyonly_keyonly*", counter: e("keyonly", "keyonly*")}},
		{name: "an empty descriptors list", domain: "d", entries: e("empty_children", "v"),
			want: &want{rpu: 1, unit: config.Second, statKey: "d.empty_children"}},
	})
	m := c.Match("d", e("wrong_place", "x"))
	if m.Limit.Name != "" || len(m.Limit.Replaces) != 1 {
		t.Errorf("wrong_place rule = %+v", *m.Limit)
	}

	// Merged domains.
	c, err := config.Parse([]config.File{
		yamlFile("1.yaml", "domain: m\ndescriptors:\n  - key: key1\n    value: value1\n    rate_limit: {unit: minute, requests_per_unit: 10}\n"),
		yamlFile("2.yaml", "domain: m\ndescriptors:\n  - key: key2\n    value: value2\n    rate_limit: {unit: minute, requests_per_unit: 20}\n"),
	}, config.WithMergeDomains(true))
	if err != nil {
		t.Fatal(err)
	}
	runMatches(t, c, []matchCase{
		{name: "first file", domain: "m", entries: e("key1", "value1"), want: &want{rpu: 10, unit: config.Minute, statKey: "m.key1_value1"}},
		{name: "second file", domain: "m", entries: e("key2", "value2"), want: &want{rpu: 20, unit: config.Minute, statKey: "m.key2_value2"}},
	})

	// No files: no domains.
	if c := parse(t); len(c.Domains()) != 0 {
		t.Errorf("no files gave domains %v", c.Domains())
	}
}

func TestUnits(t *testing.T) {
	cases := []struct {
		u      config.Unit
		name   string
		d      time.Duration
		enum   int32 // Envoy's RateLimitResponse.RateLimit.Unit
		period engine.Period
	}{
		{config.Second, "second", time.Second, 1, 0},
		{config.Minute, "minute", 60 * time.Second, 2, 0},
		{config.Hour, "hour", 3600 * time.Second, 3, 0},
		{config.Day, "day", 86400 * time.Second, 4, engine.Day},
		{config.Month, "month", 30 * 86400 * time.Second, 5, engine.Month},
		{config.Year, "year", 365 * 86400 * time.Second, 6, engine.Year},
		{config.Week, "week", 7 * 86400 * time.Second, 7, engine.Week},
	}
	for _, tc := range cases {
		if tc.u.String() != tc.name || tc.u.Duration() != tc.d || int32(tc.u) != tc.enum || tc.u.CalendarPeriod() != tc.period {
			t.Errorf("%d: %q %v %v", tc.u, tc.u.String(), tc.u.Duration(), tc.u.CalendarPeriod())
		}
		for _, s := range []string{tc.name, strings.ToUpper(tc.name), strings.ToUpper(tc.name[:1]) + tc.name[1:]} {
			if u, err := config.ParseUnit(s); err != nil || u != tc.u {
				t.Errorf("ParseUnit(%q) = %v, %v", s, u, err)
			}
		}
	}
	for _, s := range []string{"", "unknown", "UNKNOWN", "minutes", "1"} {
		if u, err := config.ParseUnit(s); err == nil {
			t.Errorf("ParseUnit(%q) = %v", s, u)
		}
	}
	for _, u := range []config.Unit{config.UnitUnknown, 8, 42, -1} {
		if u.Duration() != 0 || u.String() != "unknown" || u.CalendarPeriod() != 0 {
			t.Errorf("%d, not a unit, has a length (%v), a name (%q) or a period (%v)", u, u.Duration(), u.String(), u.CalendarPeriod())
		}
	}
	// A name is compared upper-cased, as the reference does: a Kelvin sign is not a K.
	if u, err := config.ParseUnit("wee\u212a"); err == nil {
		t.Errorf("ParseUnit of week with a Kelvin sign = %v", u)
	}
}

// TestRules: Rules counts every domain's rules, nested and unlimited ones included, and not
// the levels without a rate_limit; a nil Config has none.
func TestRules(t *testing.T) {
	c, err := config.Parse([]config.File{
		yamlFile("a.yaml", `domain: a
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 3}
  - key: tenant
    descriptors:
      - key: path
        rate_limit: {unit: second, requests_per_unit: 10}
      - key: admin
        rate_limit: {unlimited: true}
`),
		yamlFile("b.yaml", "domain: b\ndescriptors:\n  - {key: ip, rate_limit: {unit: hour, requests_per_unit: 1}}\n"),
		yamlFile("c.yaml", "domain: c\ndescriptors:\n  - key: bare\n"),
	})
	if err != nil {
		t.Fatal(err)
	}
	if got := c.Rules(); got != 4 {
		t.Errorf("Rules: %d, want 4 (3 in a, 1 in b, none in c)", got)
	}
	if got := (*config.Config)(nil).Rules(); got != 0 {
		t.Errorf("Rules of a nil Config: %d, want 0", got)
	}
}
