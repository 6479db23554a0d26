package config_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/strictrate/strictrate/rls/config"
)

// record_over_limit (this service's key, beside shadow_mode) marks a rule: RecordOverLimit,
// read as the other booleans are (YAML 1.1's words included), off when absent, and shown by
// /rlconfig after the modes. It is not inherited: a rule below a marked one is not marked.
func TestRecordOverLimit(t *testing.T) {
	c := parse(t, yamlFile("tokens.yaml", `domain: ai
descriptors:
  - key: tokens
    record_over_limit: true
    rate_limit: {unit: hour, requests_per_unit: 1000}
    descriptors:
      - key: model
        rate_limit: {unit: hour, requests_per_unit: 500}
  - key: words
    record_over_limit: yes
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 10}
  - key: requests
    record_over_limit: false
    rate_limit: {unit: minute, requests_per_unit: 10}
  - key: plain
    rate_limit: {unit: minute, requests_per_unit: 10}
`))
	for _, tc := range []struct {
		entries []config.Entry
		want    bool
	}{
		{e("tokens", "alice"), true},
		{e("tokens", "alice", "model", "m1"), false},
		{e("words", "alice"), true},
		{e("requests", "alice"), false},
		{e("plain", "alice"), false},
	} {
		m := c.Match("ai", tc.entries)
		if m.Limit == nil {
			t.Fatalf("%v: no rule", tc.entries)
		}
		if m.Limit.RecordOverLimit != tc.want {
			t.Errorf("%v (%s): RecordOverLimit %t, want %t", tc.entries, m.Limit.FullKey, m.Limit.RecordOverLimit, tc.want)
		}
	}
	for _, line := range []string{
		"ai.tokens: unit=HOUR requests_per_unit=1000, shadow_mode: false, quota_mode: false, record_over_limit: true\n",
		"ai.tokens.model: unit=HOUR requests_per_unit=500, shadow_mode: false, quota_mode: false\n",
		"ai.words: unit=MINUTE requests_per_unit=10, shadow_mode: true, quota_mode: false, record_over_limit: true\n",
		"ai.plain: unit=MINUTE requests_per_unit=10, shadow_mode: false, quota_mode: false\n",
	} {
		if !strings.Contains(c.String(), line) {
			t.Errorf("String has no line %q:\n%s", line, c)
		}
	}
}

// A record_over_limit that would record nothing, or that is not where it is read, is refused
// at load, naming the file, the line and the rule: on a descriptor without a rate_limit (its
// children do not inherit it), beside unlimited: true, inside the rate_limit, beside the
// domain, or given a value that is not a boolean.
func TestRecordOverLimitRejects(t *testing.T) {
	for _, tc := range []struct {
		name   string
		yaml   string
		line   int
		reason string
	}{
		{name: "without a rate_limit", yaml: "domain: d\ndescriptors:\n  - key: k\n    record_over_limit: true\n    descriptors:\n      - {key: sub, rate_limit: {unit: hour, requests_per_unit: 5}}\n",
			line: 4, reason: "record_over_limit of 'd.k' has no rate_limit beside it: it records the hits of its own descriptor's rule, and the descriptors below it do not inherit it; move it beside the rate_limit it is for"},
		{name: "beside unlimited", yaml: "domain: d\ndescriptors:\n  - key: k\n    value: v\n    record_over_limit: true\n    rate_limit: {unlimited: true}\n",
			line: 5, reason: "record_over_limit of 'd.k_v' is beside unlimited: true, which counts nothing; remove one of them"},
		{name: "inside the rate_limit", yaml: "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: hour\n      requests_per_unit: 5\n      record_over_limit: true\n",
			line: 7, reason: "record_over_limit is inside the rate_limit: it belongs beside the descriptor's key, as shadow_mode does"},
		{name: "beside the domain", yaml: "domain: d\nrecord_over_limit: true\ndescriptors:\n  - {key: k, rate_limit: {unit: hour, requests_per_unit: 5}}\n",
			line: 2, reason: "record_over_limit is beside the domain: it belongs beside the descriptor's key, as shadow_mode does"},
		{name: "not a boolean", yaml: "domain: d\ndescriptors:\n  - key: k\n    record_over_limit: always\n    rate_limit: {unit: hour, requests_per_unit: 5}\n",
			line: 4, reason: "error loading config file: cannot unmarshal !!str `always` into bool"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := config.Parse([]config.File{yamlFile("f.yaml", tc.yaml)})
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
