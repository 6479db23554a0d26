package config_test

import (
	"errors"
	"slices"
	"strings"
	"testing"

	rlsconfv3 "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"

	"github.com/strictrate/strictrate/rls/config"
)

// The reference's configuration corpus, ported: the cases of envoyproxy/ratelimit's
// test/config/config_test.go (its files in test/config) and of its xDS provider's test
// (test/provider/xds_grpc_sotw_provider_test.go), at the version docs/rls.md pins and, for
// the newer configuration (wildcards in the middle of a value, metadata, quota_mode over
// xDS), its later commits. Each case is the reference's configuration, request and answer,
// re-expressed (a rule's stats key is Match.StatKey; a rejection's reason is Error.Reason,
// which the reference prints after the file's name), and names the reference test it comes
// from. Every one answers as the reference does; rls/compat_test.go counts them with the
// other ported files'.

// refReject is a file set the reference refuses, and its reason.
type refReject struct {
	ref    string
	files  []config.File
	merge  bool
	reason string
}

// refLookup is a lookup of the reference's tests and its answer: a Match (matchCase), or a
// request's override when rpu is set.
type refLookup struct {
	ref string
	matchCase
	overrideRPU  uint32
	overrideUnit config.Unit
}

// refFile is one file of the reference's corpus (or one of its tests' inline configurations)
// and the lookups the tests make in it.
type refFile struct {
	name    string
	files   []config.File
	merge   bool
	lookups []refLookup
}

func TestReferenceRejects(t *testing.T) {
	const domainOnly = "domain: test-domain\n"
	basic := yamlFile("basic_config.yaml", basicYAML)
	merge1 := yamlFile("merge_domain_key1.yaml", mergeKey1YAML)
	for _, tc := range []refReject{
		{ref: "TestEmptyDomain", files: []config.File{yamlFile("empty_domain.yaml", "descriptors:\n")},
			reason: "config file cannot have empty domain"},
		{ref: "TestDuplicateDomain", files: []config.File{basic, yamlFile("duplicate_domain.yaml", domainOnly+"descriptors:\n  - {key: key1, rate_limit: {unit: day, requests_per_unit: 5}}\n")},
			reason: "duplicate domain 'test-domain' in config file"},
		{ref: "TestEmptyKey", files: []config.File{yamlFile("empty_key.yaml", domainOnly+"descriptors:\n  - {key: '', value: v, rate_limit: {unit: day, requests_per_unit: 5}}\n")},
			reason: "descriptor has empty key"},
		{ref: "TestDuplicateKey", files: []config.File{yamlFile("duplicate_key.yaml", domainOnly+"descriptors:\n  - {key: key1, value: value1, rate_limit: {unit: day, requests_per_unit: 5}}\n  - {key: key1, value: value1, rate_limit: {unit: day, requests_per_unit: 5}}\n")},
			reason: "duplicate descriptor composite key 'test-domain.key1_value1'"},
		{ref: "TestDuplicateKeyDomainMerge", files: []config.File{merge1, merge1}, merge: true,
			reason: "duplicate descriptor composite key 'test-domain.key1_value1'"},
		{ref: "TestBadLimitUnit", files: []config.File{yamlFile("bad_limit_unit.yaml", domainOnly+"descriptors:\n  - {key: key1, value: value1, rate_limit: {unit: foo, requests_per_unit: 5}}\n")},
			reason: "invalid rate limit unit 'foo'"},
		{ref: "TestReplacesSelf", files: []config.File{yamlFile("replaces_self.yaml", domainOnly+"descriptors:\n  - {key: key1, rate_limit: {name: self, replaces: [{name: self}], unit: second, requests_per_unit: 5}}\n")},
			reason: "replaces should not contain name of same descriptor"},
		{ref: "TestReplacesEmpty", files: []config.File{yamlFile("replaces_empty.yaml", domainOnly+"descriptors:\n  - {key: key1, rate_limit: {name: self, replaces: [{name: }], unit: second, requests_per_unit: 5}}\n")},
			reason: "should not have an empty replaces entry"},
		{ref: "TestBadYaml", files: []config.File{yamlFile("bad_yaml.yaml", "'''\n")},
			reason: "error loading config file: yaml: line 2: found unexpected end of stream"},
		{ref: "TestMisspelledKey", files: []config.File{yamlFile("misspelled_key.yaml", domainOnly+"descriptors:\n  - {key: key1, ratelimit: {unit: day, requests_per_unit: 5}}\n")},
			reason: "config error, unknown key 'ratelimit'"},
		{ref: "TestMisspelledKey (2)", files: []config.File{yamlFile("misspelled_key2.yaml", domainOnly+"descriptors:\n  - {key: key1, rate_limit: {unit: day, requestsperunit: 5}}\n")},
			reason: "config error, unknown key 'requestsperunit'"},
		{ref: "TestNonStringKey", files: []config.File{yamlFile("non_string_key.yaml", "0.25: test-domain\ndescriptors:\n  - {key: key1, rate_limit: {unit: day, requests_per_unit: 5}}\n")},
			reason: "config error, key is not of type string: 0.25"},
		{ref: "TestNonMapList", files: []config.File{yamlFile("non_map_list.yaml", domainOnly+"descriptors: [a, b, c]\n")},
			reason: "config error, yaml file contains list of type other than map: a"},
		{ref: "TestUnlimitedWithRateLimitUnit", files: []config.File{yamlFile("unlimited_with_unit.yaml", domainOnly+"descriptors:\n  - {key: foo, rate_limit: {unlimited: true, unit: day, requests_per_unit: 25}}\n")},
			reason: "should not specify rate limit unit when unlimited"},
	} {
		t.Run(tc.ref, func(t *testing.T) {
			c, err := config.Parse(tc.files, config.WithMergeDomains(tc.merge))
			var ce *config.Error
			if !errors.As(err, &ce) {
				t.Fatalf("Parse = %v, %v; want it refused: %s", c, err, tc.reason)
			}
			if last := tc.files[len(tc.files)-1].Name; ce.File != last || ce.Reason != tc.reason {
				t.Errorf("refused %s: %q; want %s: %q", ce.File, ce.Reason, last, tc.reason)
			}
		})
	}
}

// mergeKey1YAML and mergeKey2YAML are the two files of the reference's domain merge tests.
const (
	mergeKey1YAML = "domain: test-domain\ndescriptors:\n  - {key: key1, value: value1, rate_limit: {unit: minute, requests_per_unit: 10}}\n"
	mergeKey2YAML = "domain: test-domain\ndescriptors:\n  - {key: key2, value: value2, rate_limit: {unit: minute, requests_per_unit: 20}}\n"
)

// The inline configurations of the reference's metric tests, in YAML.
const (
	// detailedYAML is TestDetailedMetric's "realistic example" (domain nested).
	detailedYAML = `domain: nested
descriptors:
  - {key: key_1, detailed_metric: true, rate_limit: {requests_per_unit: 500, unit: minute}}
  - {key: key_1, value: some-value-for-key-1, rate_limit: {requests_per_unit: 500, unit: minute}}
  - key: key_2
    detailed_metric: true
    rate_limit: {requests_per_unit: 5000, unit: minute}
    descriptors:
      - {key: key_3, detailed_metric: true}
      - {key: key_3, value: requested-key3-value, detailed_metric: true, rate_limit: {requests_per_unit: 5, unit: minute}}
  - key: key_2
    value: specific-id
    detailed_metric: true
    rate_limit: {requests_per_unit: 50000, unit: minute}
    descriptors:
      - {key: key_3, detailed_metric: true}
      - {key: key_3, value: requested-key3-value, detailed_metric: true, rate_limit: {requests_per_unit: 100, unit: minute}}
`
	// valueToMetricYAML is route, http_method and subject_id with value_to_metric above the
	// rule (TestValueToMetric_UsesRuntimeValuesInStats, _WithEmptyValue,
	// _FullKeyMatchesStatsKey).
	valueToMetricYAML = `domain: domain
descriptors:
  - key: route
    value_to_metric: true
    descriptors:
      - key: http_method
        value_to_metric: true
        descriptors:
          - {key: subject_id, rate_limit: {requests_per_unit: 60, unit: minute}}
`
	// metadataYAML is the reference's metadata.yaml (its newer versions).
	metadataYAML = `domain: test-domain
descriptors:
  - key: key1
    value: value1
    descriptors:
      - {key: subkey1, rate_limit: {unit: second, requests_per_unit: 5}, metadata: {name: service_1}}
      - {key: subkey1, value: subvalue1, rate_limit: {unit: second, requests_per_unit: 10}}
  - key: key2
    rate_limit: {unit: minute, requests_per_unit: 20}
    metadata:
      service_with_quota: {name: service_2}
`
)

// nestedKeys is a configuration of domain whose descriptors are nested one below the other,
// each level a flow map's content ("key: k1, value_to_metric: true").
func nestedKeys(domain string, levels ...string) string {
	inner := ""
	for i := len(levels) - 1; i >= 0; i-- {
		if inner == "" {
			inner = "{" + levels[i] + "}"
		} else {
			inner = "{" + levels[i] + ", descriptors: [" + inner + "]}"
		}
	}
	return "domain: " + domain + "\ndescriptors: [" + inner + "]\n"
}

// lookup is a lookup of ref's in domain, answered w (nil: no rule).
func lookup(ref, domain string, entries []config.Entry, w *want) refLookup {
	return refLookup{ref: ref, matchCase: matchCase{name: ref, domain: domain, entries: entries, want: w}}
}

func TestReferenceLookups(t *testing.T) {
	const basicRef = "TestBasicConfig"
	basic := []config.File{yamlFile("basic_config.yaml", basicYAML)}
	td := "test-domain"
	minute := func(rpu uint32, statKey string) *want { return &want{rpu: rpu, unit: config.Minute, statKey: statKey} }
	shared := func(rpu uint32, statKey string, counter ...string) *want {
		return &want{rpu: rpu, unit: config.Minute, statKey: statKey, counter: e(counter...)}
	}
	files := []refFile{
		{name: "basic_config.yaml", files: basic, lookups: []refLookup{
			lookup(basicRef, "foo_domain", nil, nil),
			lookup(basicRef, td, nil, nil),
			lookup(basicRef, td, e("key1", "something"), nil),
			lookup(basicRef, td, e("key1", "value1"), nil),
			lookup(basicRef, td, e("key2", "value2", "subkey", "subvalue"), nil),
			lookup(basicRef, td, e("key5", "value5", "subkey5", "subvalue"), nil),
			lookup(basicRef, td, e("key1", "value1", "subkey1", "something"), &want{rpu: 5, unit: config.Second, statKey: "test-domain.key1_value1.subkey1"}),
			lookup(basicRef, td, e("key1", "value1", "subkey1", "subvalue1"), &want{rpu: 10, unit: config.Second, statKey: "test-domain.key1_value1.subkey1_subvalue1"}),
			lookup(basicRef, td, e("key2", "something"), minute(20, "test-domain.key2")),
			lookup(basicRef, td, e("key2", "value2"), minute(30, "test-domain.key2_value2")),
			lookup(basicRef, td, e("key2", "value3"), nil),
			lookup(basicRef, td, e("key3", "foo"), &want{rpu: 1, unit: config.Hour, statKey: "test-domain.key3"}),
			lookup(basicRef, td, e("key4", "foo"), &want{rpu: 1, unit: config.Day, statKey: "test-domain.key4", name: "key4_rate_limit"}),
			lookup(basicRef, td, e("key6", "foo"), &want{unlimited: true, statKey: "test-domain.key6"}),
			lookup(basicRef, td, e("key7", "unspecified_value"), minute(70, "test-domain.key7_unspecified_value")),
			lookup(basicRef, td, e("key7", "another_value"), minute(70, "test-domain.key7_another_value")),
			{ref: "TestConfigLimitOverride", matchCase: matchCase{domain: "foo_domain"}, overrideRPU: 10, overrideUnit: config.Day},
			{ref: "TestConfigLimitOverride", matchCase: matchCase{domain: td, entries: e("key1", "value1", "subkey1", "something"),
				want: &want{rpu: 10, unit: config.Day, statKey: "test-domain.key1_value1.subkey1_something"}}, overrideRPU: 10, overrideUnit: config.Day},
			{ref: "TestConfigLimitOverride", matchCase: matchCase{domain: td, entries: e("key1", "value1", "subkey1", "something"),
				want: &want{rpu: 42, unit: config.Hour, statKey: "test-domain.key1_value1.subkey1_something"}}, overrideRPU: 42, overrideUnit: config.Hour},
			{ref: "TestConfigLimitOverride", matchCase: matchCase{domain: td, entries: e("key1", "value1", "subkey1", "something_else"),
				want: &want{rpu: 42, unit: config.Hour, statKey: "test-domain.key1_value1.subkey1_something_else"}}, overrideRPU: 42, overrideUnit: config.Hour},
		}},
		{name: "merge_domain_key1.yaml, merge_domain_key2.yaml", merge: true,
			files: []config.File{yamlFile("merge_domain_key1.yaml", mergeKey1YAML), yamlFile("merge_domain_key2.yaml", mergeKey2YAML)},
			lookups: []refLookup{
				lookup("TestDomainMerge", "foo_domain", nil, nil),
				lookup("TestDomainMerge", td, nil, nil),
				lookup("TestDomainMerge", td, e("key1", "value1"), minute(10, "test-domain.key1_value1")),
				lookup("TestDomainMerge", td, e("key2", "value2"), minute(20, "test-domain.key2_value2")),
			}},
		{name: "shadowmode_config.yaml", files: []config.File{yamlFile("shadowmode_config.yaml", `domain: test-domain
descriptors:
  - key: key1
    value: value1
    descriptors:
      - {key: subkey1, rate_limit: {unit: second, requests_per_unit: 5}}
      - {key: subkey1, value: subvalue1, shadow_mode: true, rate_limit: {unit: second, requests_per_unit: 10}}
  - {key: key2, shadow_mode: true, rate_limit: {unit: minute, requests_per_unit: 20}}
  - {key: key2, value: value2, rate_limit: {unit: minute, requests_per_unit: 30}}
`)}, lookups: []refLookup{
			lookup("TestShadowModeConfig", td, e("key1", "value1", "subkey1", "something"), &want{rpu: 5, unit: config.Second, statKey: "test-domain.key1_value1.subkey1"}),
			lookup("TestShadowModeConfig", td, e("key1", "value1", "subkey1", "subvalue1"), &want{rpu: 10, unit: config.Second, statKey: "test-domain.key1_value1.subkey1_subvalue1", shadow: true}),
			lookup("TestShadowModeConfig", td, e("key2", "something"), &want{rpu: 20, unit: config.Minute, statKey: "test-domain.key2", shadow: true}),
			lookup("TestShadowModeConfig", td, e("key2", "value2"), minute(30, "test-domain.key2_value2")),
		}},
		{name: "wildcard.yaml", files: []config.File{yamlFile("wildcard.yaml", wildcardYAML)}, lookups: []refLookup{
			lookup("TestWildcardConfig", td, e("noVal", "foo1"), minute(22, "test-domain.noVal")),
			lookup("TestWildcardConfig", td, e("noVal", "foo2"), minute(22, "test-domain.noVal")),
			lookup("TestWildcardConfig", td, e("wild", "foo1"), minute(20, "test-domain.wild_foo*")),
			lookup("TestWildcardConfig", td, e("wild", "foo2"), minute(20, "test-domain.wild_foo*")),
			lookup("TestWildcardConfig", td, e("nestedWild", "val1", "wild", "goo2"), minute(24, "test-domain.nestedWild_val1.wild_goo*")),
			lookup("TestWildcardConfig", td, e("wild", "bar"), nil),
			lookup("TestWildcardConfig", td, e("noWild", "foo1"), nil),
			lookup("TestWildcardConfig (pinned: an unconfigured key)", td, e("midWildcard", "barab"), nil),
			lookup("TestWildcardConfig (newer)", td, e("midWild", "barab"), minute(23, "test-domain.midWild_bar*b")),
			lookup("TestWildcardConfig (newer)", td, e("midWild", "bar123b"), minute(23, "test-domain.midWild_bar*b")),
			lookup("TestWildcardConfig (newer)", td, e("midWild", "barb"), minute(23, "test-domain.midWild_bar*b")),
			lookup("TestWildcardConfig (newer)", td, e("midWild", "bara"), nil),
			lookup("TestWildcardConfig (newer)", td, e("midWild", "xbarb"), nil),
			lookup("TestWildcardConfig (newer)", td, e("multiWild", "foo123bar456baz"), minute(25, "test-domain.multiWild_foo*bar*baz")),
			lookup("TestWildcardConfig (newer)", td, e("multiWild", "foobarbaz"), minute(25, "test-domain.multiWild_foo*bar*baz")),
			lookup("TestWildcardConfig (newer)", td, e("multiWild", "foo123baz"), nil),
			lookup("TestWildcardConfig (newer)", td, e("multiWild", "bar456baz"), nil),
		}},
		{name: "TestDetailedMetric, nested with detailed_metric", files: []config.File{yamlFile("inline", nestedKeys("nested",
			"key: key-1, detailed_metric: true, rate_limit: {requests_per_unit: 100, unit: minute}",
			"key: key-2, detailed_metric: true, rate_limit: {requests_per_unit: 5, unit: minute}"))}, lookups: []refLookup{
			lookup("TestDetailedMetric: request only top-level key", "nested", e("key-1", "value-1"), minute(100, "nested.key-1_value-1")),
			lookup("TestDetailedMetric: request fully nested", "nested", e("key-1", "value-1", "key-2", "value-2"), minute(5, "nested.key-1_value-1.key-2_value-2")),
		}},
		{name: "TestDetailedMetric, nested without detailed_metric", files: []config.File{yamlFile("inline", nestedKeys("nested",
			"key: key-1, rate_limit: {requests_per_unit: 100, unit: minute}",
			"key: key-2, rate_limit: {requests_per_unit: 5, unit: minute}"))}, lookups: []refLookup{
			lookup("TestDetailedMetric: top-level key, no detailed metric", "nested", e("key-1", "value-1"), minute(100, "nested.key-1")),
			lookup("TestDetailedMetric: fully nested, no detailed metric", "nested", e("key-1", "value-1", "key-2", "value-2"), minute(5, "nested.key-1.key-2")),
		}},
		{name: "TestDetailedMetric, realistic example", files: []config.File{yamlFile("inline", detailedYAML)}, lookups: []refLookup{
			lookup("TestDetailedMetric: simple request", "nested", e("key_1", "value-for-key-1"), minute(500, "nested.key_1_value-for-key-1")),
			lookup("TestDetailedMetric: second descriptor, not nested", "nested", e("key_2", "key-2-value"), minute(5000, "nested.key_2_key-2-value")),
			lookup("TestDetailedMetric: nested request", "nested", e("key_2", "key-2-value", "key_3", "requested-key3-value"), minute(5, "nested.key_2_key-2-value.key_3_requested-key3-value")),
		}},
		{name: "TestValueToMetric_*, route/http_method/subject_id", files: []config.File{yamlFile("inline", valueToMetricYAML)}, lookups: []refLookup{
			lookup("TestValueToMetric_UsesRuntimeValuesInStats", "domain", e("route", "draw", "http_method", "GET", "subject_id", "123"), minute(60, "domain.route_draw.http_method_GET.subject_id")),
			lookup("TestValueToMetric_WithEmptyValue", "domain", e("route", "", "http_method", "GET", "subject_id", "123"), minute(60, "domain.route.http_method_GET.subject_id")),
			lookup("TestValueToMetric_WithEmptyValue", "domain", e("route", "draw", "http_method", "", "subject_id", "123"), minute(60, "domain.route_draw.http_method.subject_id")),
			lookup("TestValueToMetric_WithEmptyValue", "domain", e("route", "", "http_method", "", "subject_id", "123"), minute(60, "domain.route.http_method.subject_id")),
			lookup("TestValueToMetric_FullKeyMatchesStatsKey", "domain", e("route", "api", "http_method", "GET", "subject_id", "user123"), minute(60, "domain.route_api.http_method_GET.subject_id")),
		}},
		{name: "TestValueToMetric_DefaultKeyIncludesValueAtThatLevel", files: []config.File{yamlFile("inline", nestedKeys("d",
			"key: k1, value_to_metric: true", "key: k2, rate_limit: {requests_per_unit: 1, unit: second}"))}, lookups: []refLookup{
			lookup("TestValueToMetric_DefaultKeyIncludesValueAtThatLevel", "d", e("k1", "A", "k2", "foo"), &want{rpu: 1, unit: config.Second, statKey: "d.k1_A.k2"}),
		}},
		{name: "TestValueToMetric_MidLevelOnly", files: []config.File{yamlFile("inline", nestedKeys("d",
			"key: k1", "key: k2, value_to_metric: true", "key: k3, rate_limit: {requests_per_unit: 1, unit: second}"))}, lookups: []refLookup{
			lookup("TestValueToMetric_MidLevelOnly", "d", e("k1", "X", "k2", "Y", "k3", "Z"), &want{rpu: 1, unit: config.Second, statKey: "d.k1.k2_Y.k3"}),
		}},
		{name: "TestValueToMetric_NoFlag_Unchanged", files: []config.File{yamlFile("inline", nestedKeys("d",
			"key: k1", "key: k2, rate_limit: {requests_per_unit: 1, unit: second}"))}, lookups: []refLookup{
			lookup("TestValueToMetric_NoFlag_Unchanged", "d", e("k1", "X", "k2", "Y"), &want{rpu: 1, unit: config.Second, statKey: "d.k1.k2"}),
		}},
		{name: "TestValueToMetric_DoesNotOverrideDetailedMetric", files: []config.File{yamlFile("inline", nestedKeys("domain",
			"key: route, value_to_metric: true", "key: http_method, value_to_metric: true",
			"key: subject_id, detailed_metric: true, rate_limit: {requests_per_unit: 60, unit: minute}"))}, lookups: []refLookup{
			lookup("TestValueToMetric_DoesNotOverrideDetailedMetric", "domain", e("route", "draw", "http_method", "GET", "subject_id", "123"), minute(60, "domain.route_draw.http_method_GET.subject_id_123")),
		}},
		{name: "TestValueToMetric_WithConfiguredValues", files: []config.File{yamlFile("inline", `domain: test-domain
descriptors:
  - key: route
    value_to_metric: true
    descriptors:
      - key: http_method
        value: GET
        value_to_metric: true
        descriptors: [{key: subject_id, rate_limit: {requests_per_unit: 60, unit: minute}}]
      - key: http_method
        value: POST
        value_to_metric: true
        descriptors: [{key: subject_id, rate_limit: {requests_per_unit: 30, unit: minute}}]
`)}, lookups: []refLookup{
			lookup("TestValueToMetric_WithConfiguredValues", td, e("route", "api", "http_method", "GET", "subject_id", "user123"), minute(60, "test-domain.route_api.http_method_GET.subject_id")),
			lookup("TestValueToMetric_WithConfiguredValues", td, e("route", "api", "http_method", "POST", "subject_id", "user456"), minute(30, "test-domain.route_api.http_method_POST.subject_id")),
		}},
		{name: "TestValueToMetric_WithWildcard", files: []config.File{yamlFile("inline", nestedKeys("domain",
			"key: user, value_to_metric: true", "key: action, value: read*, value_to_metric: true",
			"key: resource, rate_limit: {requests_per_unit: 100, unit: minute}"))}, lookups: []refLookup{
			lookup("TestValueToMetric_WithWildcard", "domain", e("user", "alice", "action", "readfile", "resource", "documents"), minute(100, "domain.user_alice.action_readfile.resource")),
			lookup("TestValueToMetric_WithWildcard", "domain", e("user", "bob", "action", "readdata", "resource", "database"), minute(100, "domain.user_bob.action_readdata.resource")),
		}},
		{name: "TestValueToMetric_FullKeyMatchesStatsKey, without flags", files: []config.File{yamlFile("inline", nestedKeys("test-domain-2",
			"key: route", "key: http_method", "key: subject_id, rate_limit: {requests_per_unit: 60, unit: minute}"))}, lookups: []refLookup{
			lookup("TestValueToMetric_FullKeyMatchesStatsKey", "test-domain-2", e("route", "api", "http_method", "GET", "subject_id", "user123"), minute(60, "test-domain-2.route.http_method.subject_id")),
		}},
		{name: "TestValueToMetric_FullKeyMatchesStatsKey, detailed", files: []config.File{yamlFile("inline", nestedKeys("test-domain-3",
			"key: route", "key: http_method", "key: subject_id, detailed_metric: true, rate_limit: {requests_per_unit: 60, unit: minute}"))}, lookups: []refLookup{
			lookup("TestValueToMetric_FullKeyMatchesStatsKey", "test-domain-3", e("route", "api", "http_method", "GET", "subject_id", "user123"), minute(60, "test-domain-3.route_api.http_method_GET.subject_id_user123")),
		}},
		{name: "share_threshold.yaml", files: []config.File{yamlFile("share_threshold.yaml", shareYAML)}, lookups: []refLookup{
			lookup("TestShareThreshold: basic", td, e("files", "files/a.pdf"), shared(100, "test-domain.files_files/*", "files", "files/*")),
			lookup("TestShareThreshold: basic", td, e("files", "files/b.csv"), shared(100, "test-domain.files_files/*", "files", "files/*")),
			lookup("TestShareThreshold: basic", td, e("files", "files/c.txt"), shared(100, "test-domain.files_files/*", "files", "files/*")),
			lookup("TestShareThreshold: with metrics", td, e("route", "api/v1", "method", "GET"), shared(60, "test-domain.route_api/*.method", "route", "api/*", "method", "GET")),
			lookup("TestShareThreshold: with metrics", td, e("service", "svc/user", "endpoint", "get"), shared(80, "test-domain.service_svc/*.endpoint_get", "service", "svc/*", "endpoint", "get")),
			lookup("TestShareThreshold: nested", td, e("nested", "parent", "files", "nested/file1.txt"), shared(200, "test-domain.nested_parent.files_nested/*", "nested", "parent", "files", "nested/*")),
			lookup("TestShareThreshold: nested", td, e("files", "top/file1.txt", "files", "nested/file1.txt"), shared(300, "test-domain.files_top/*.files_nested/*", "files", "top/*", "files", "nested/*")),
			lookup("TestShareThreshold: nested", td, e("path", "path/foo", "file", "file/doc1", "type", "pdf"), shared(120, "test-domain.path_path/*.file_file/*.type", "path", "path/*", "file", "file/doc1", "type", "pdf")),
			lookup("TestShareThreshold: nested", td, e("user", "user/alice", "resource", "res/file1", "action", "read"), shared(150, "test-domain.user_user/*.resource_res/*.action", "user", "user/*", "resource", "res/*", "action", "read")),
			lookup("TestShareThreshold: explicit value first", td, e("file", "test1"), minute(50, "test-domain.file_test1")),
			lookup("TestShareThreshold: explicit value first", td, e("file", "test2"), shared(100, "test-domain.file_test*", "file", "test*")),
			lookup("TestShareThreshold: explicit value first", td, e("file", "test23"), shared(100, "test-domain.file_test*", "file", "test*")),
			lookup("TestShareThreshold: explicit value first", td, e("file", "test123"), shared(100, "test-domain.file_test*", "file", "test*")),
			lookup("TestShareThreshold: middle wildcard (newer)", td, e("midpath", "/api/v1"), shared(100, "test-domain.midpath_/api*v1", "midpath", "/api*v1")),
			lookup("TestShareThreshold: middle wildcard (newer)", td, e("midpath", "/api-beta-v1"), shared(100, "test-domain.midpath_/api*v1", "midpath", "/api*v1")),
			lookup("TestShareThreshold: middle wildcard (newer)", td, e("midpath", "/apiXYZv1"), shared(100, "test-domain.midpath_/api*v1", "midpath", "/api*v1")),
			lookup("TestShareThreshold: middle wildcard (newer)", td, e("midpath", "/api/v2"), nil),
			lookup("TestShareThreshold: multi-wildcard (newer)", td, e("multiroute", "svcAepBrpc"), shared(50, "test-domain.multiroute_svc*ep*rpc", "multiroute", "svc*ep*rpc")),
			lookup("TestShareThreshold: multi-wildcard (newer)", td, e("multiroute", "svcXXXepYYYrpc"), shared(50, "test-domain.multiroute_svc*ep*rpc", "multiroute", "svc*ep*rpc")),
			lookup("TestShareThreshold: multi-wildcard (newer)", td, e("multiroute", "svceprpc"), shared(50, "test-domain.multiroute_svc*ep*rpc", "multiroute", "svc*ep*rpc")),
			lookup("TestShareThreshold: multi-wildcard (newer)", td, e("multiroute", "svcABCrpc"), nil),
			lookup("TestShareThreshold: priority over value_to_metric (newer)", td, e("midroute", "/api/v2"), shared(80, "test-domain.midroute_/api*v2", "midroute", "/api*v2")),
			lookup("TestShareThreshold: priority over value_to_metric (newer)", td, e("midroute", "/api-beta-v2"), shared(80, "test-domain.midroute_/api*v2", "midroute", "/api*v2")),
			lookup("TestShareThreshold: nested middle wildcards (newer)", td, e("tenant", "t1prod", "resource", "resAv2"), shared(60, "test-domain.tenant_t*prod.resource_res*v2", "tenant", "t*prod", "resource", "res*v2")),
			lookup("TestShareThreshold: nested middle wildcards (newer)", td, e("tenant", "t99prod", "resource", "resBBBv2"), shared(60, "test-domain.tenant_t*prod.resource_res*v2", "tenant", "t*prod", "resource", "res*v2")),
		}},
		{name: "TestWildcardStatsBehavior, no flags", files: []config.File{yamlFile("inline", "domain: test-domain\ndescriptors:\n  - {key: wild, value: foo*, rate_limit: {requests_per_unit: 20, unit: minute}}\n")}, lookups: []refLookup{
			lookup("TestWildcardStatsBehavior: no flags", td, e("wild", "foo1"), minute(20, "test-domain.wild_foo*")),
		}},
		{name: "TestWildcardStatsBehavior, value_to_metric", files: []config.File{yamlFile("inline", "domain: test-domain\ndescriptors:\n  - {key: wild, value: foo*, value_to_metric: true, rate_limit: {requests_per_unit: 20, unit: minute}}\n")}, lookups: []refLookup{
			lookup("TestWildcardStatsBehavior: value_to_metric", td, e("wild", "foo1"), minute(20, "test-domain.wild_foo1")),
		}},
		{name: "TestWildcardStatsBehavior, share_threshold", files: []config.File{yamlFile("inline", "domain: test-domain\ndescriptors:\n  - {key: wild, value: foo*, share_threshold: true, rate_limit: {requests_per_unit: 20, unit: minute}}\n")}, lookups: []refLookup{
			lookup("TestWildcardStatsBehavior: share_threshold", td, e("wild", "foo1"), shared(20, "test-domain.wild_foo*", "wild", "foo*")),
		}},
		{name: "TestWildcardStatsBehavior, share_threshold and value_to_metric", files: []config.File{yamlFile("inline", "domain: test-domain\ndescriptors:\n  - {key: wild, value: foo*, share_threshold: true, value_to_metric: true, rate_limit: {requests_per_unit: 20, unit: minute}}\n")}, lookups: []refLookup{
			lookup("TestWildcardStatsBehavior: share_threshold wins over value_to_metric", td, e("wild", "foo1"), shared(20, "test-domain.wild_foo*", "wild", "foo*")),
		}},
		{name: "TestWildcardStatsBehavior, value_to_metric elsewhere", files: []config.File{yamlFile("inline", nestedKeys(td,
			"key: wild, value: foo*", "key: other, value_to_metric: true", "key: limit, rate_limit: {requests_per_unit: 20, unit: minute}"))}, lookups: []refLookup{
			lookup("TestWildcardStatsBehavior: value_to_metric on another level", td, e("wild", "foo1", "other", "bar", "limit", "X"), minute(20, "test-domain.wild_foo*.other_bar.limit")),
		}},
		{name: "TestWildcardStatsBehavior, middle and trailing (newer)", files: []config.File{yamlFile("inline", "domain: test-domain\ndescriptors:\n  - {key: wild, value: foo*bar*, rate_limit: {requests_per_unit: 20, unit: minute}}\n")}, lookups: []refLookup{
			lookup("TestWildcardStatsBehavior: middle and trailing, no flags", td, e("wild", "foo123bar456"), minute(20, "test-domain.wild_foo*bar*")),
			lookup("TestWildcardStatsBehavior: middle and trailing, no flags", td, e("wild", "fooXbarY"), minute(20, "test-domain.wild_foo*bar*")),
		}},
		{name: "TestWildcardStatsBehavior, middle and trailing with value_to_metric (newer)", files: []config.File{yamlFile("inline", "domain: test-domain\ndescriptors:\n  - {key: wild, value: foo*bar*, value_to_metric: true, rate_limit: {requests_per_unit: 20, unit: minute}}\n")}, lookups: []refLookup{
			lookup("TestWildcardStatsBehavior: middle and trailing, value_to_metric", td, e("wild", "foo123bar456"), minute(20, "test-domain.wild_foo123bar456")),
		}},
		{name: "metadata.yaml (newer)", files: []config.File{yamlFile("metadata.yaml", metadataYAML)}, lookups: []refLookup{
			lookup("TestMetadata", td, nil, nil),
			lookup("TestMetadata", td, e("key1", "value1", "subkey1", "something"), &want{rpu: 5, unit: config.Second,
				statKey: "test-domain.key1_value1.subkey1", metadata: map[string]any{"name": "service_1"}}),
			lookup("TestMetadata", td, e("key2", "something"), &want{rpu: 20, unit: config.Minute,
				statKey: "test-domain.key2", metadata: map[string]any{"service_with_quota": map[string]any{"name": "service_2"}}}),
		}},
	}
	for _, f := range files {
		t.Run(f.name, func(t *testing.T) {
			c, err := config.Parse(f.files, config.WithMergeDomains(f.merge))
			if err != nil {
				t.Fatalf("Parse: %v", err)
			}
			var matches []matchCase
			for _, l := range f.lookups {
				l.name = l.ref
				if l.overrideRPU == 0 {
					matches = append(matches, l.matchCase)
					continue
				}
				m := c.Override(l.domain, l.entries, l.overrideRPU, l.overrideUnit)
				switch w := l.want; {
				case w == nil && m.Limit != nil:
					t.Errorf("%s: override = %+v, want none", l.ref, *m.Limit)
				case w != nil && (m.Limit == nil || m.Limit.RequestsPerUnit != w.rpu || m.Limit.Unit != w.unit || m.StatKey != w.statKey):
					t.Errorf("%s: override = %+v (stat %q), want %+v", l.ref, m.Limit, m.StatKey, *w)
				}
			}
			runMatches(t, c, matches)
		})
	}
}

// TestReferenceXDS: the reference's xDS provider test's snapshots (TestXdsProvider) build the
// configurations its dumps show, /rlconfig's lines, quota_mode among them (newer).
func TestReferenceXDS(t *testing.T) {
	policy := func(unit rlsconfv3.RateLimitUnit, n uint32) *rlsconfv3.RateLimitPolicy {
		return &rlsconfv3.RateLimitPolicy{Unit: unit, RequestsPerUnit: n}
	}
	unlimited := &rlsconfv3.RateLimitPolicy{Unlimited: true}
	rlc := func(name, domain string, ds ...*rlsconfv3.RateLimitDescriptor) *rlsconfv3.RateLimitConfig {
		return &rlsconfv3.RateLimitConfig{Name: name, Domain: domain, Descriptors: ds}
	}
	desc := func(key, value string, rl *rlsconfv3.RateLimitPolicy, children ...*rlsconfv3.RateLimitDescriptor) *rlsconfv3.RateLimitDescriptor {
		return &rlsconfv3.RateLimitDescriptor{Key: key, Value: value, RateLimit: rl, Descriptors: children}
	}
	modes := desc("j2", "v2", policy(rlsconfv3.RateLimitUnit_DAY, 15))
	modes.ShadowMode, modes.QuotaMode = true, true
	for _, tc := range []struct {
		ref   string
		cfgs  []*rlsconfv3.RateLimitConfig
		merge bool
		want  []string
	}{
		{ref: "testInitialXdsConfig", cfgs: []*rlsconfv3.RateLimitConfig{rlc("foo", "foo", desc("k1", "v1", policy(rlsconfv3.RateLimitUnit_MINUTE, 3)))},
			want: []string{"foo.k1_v1: unit=MINUTE requests_per_unit=3, shadow_mode: false, quota_mode: false"}},
		{ref: "testNewXdsConfigUpdate", cfgs: []*rlsconfv3.RateLimitConfig{rlc("foo", "foo", desc("k2", "v2", policy(rlsconfv3.RateLimitUnit_MINUTE, 5)))},
			want: []string{"foo.k2_v2: unit=MINUTE requests_per_unit=5, shadow_mode: false, quota_mode: false"}},
		{ref: "testMultiDomainXdsConfigUpdate", cfgs: []*rlsconfv3.RateLimitConfig{
			rlc("foo", "foo", desc("k1", "v1", policy(rlsconfv3.RateLimitUnit_MINUTE, 10))),
			rlc("bar", "bar", desc("k1", "v1", policy(rlsconfv3.RateLimitUnit_MINUTE, 100)))},
			want: []string{
				"foo.k1_v1: unit=MINUTE requests_per_unit=10, shadow_mode: false, quota_mode: false",
				"bar.k1_v1: unit=MINUTE requests_per_unit=100, shadow_mode: false, quota_mode: false"}},
		{ref: "testDeeperLimitsXdsConfigUpdate", cfgs: []*rlsconfv3.RateLimitConfig{
			rlc("foo", "foo",
				desc("k1", "v1", policy(rlsconfv3.RateLimitUnit_MINUTE, 10),
					desc("k2", "", unlimited), desc("k2", "v2", policy(rlsconfv3.RateLimitUnit_HOUR, 15))),
				desc("j1", "v2", unlimited, desc("j2", "", unlimited), modes)),
			rlc("bar", "bar", desc("k1", "v1", policy(rlsconfv3.RateLimitUnit_MINUTE, 100)))},
			want: []string{
				"foo.k1_v1: unit=MINUTE requests_per_unit=10, shadow_mode: false, quota_mode: false",
				"foo.k1_v1.k2: unit=UNKNOWN requests_per_unit=0, shadow_mode: false, quota_mode: false",
				"foo.k1_v1.k2_v2: unit=HOUR requests_per_unit=15, shadow_mode: false, quota_mode: false",
				"foo.j1_v2: unit=UNKNOWN requests_per_unit=0, shadow_mode: false, quota_mode: false",
				"foo.j1_v2.j2: unit=UNKNOWN requests_per_unit=0, shadow_mode: false, quota_mode: false",
				"foo.j1_v2.j2_v2: unit=DAY requests_per_unit=15, shadow_mode: true, quota_mode: true",
				"bar.k1_v1: unit=MINUTE requests_per_unit=100, shadow_mode: false, quota_mode: false"}},
		{ref: "testSameDomainMultipleXdsConfigUpdate", merge: true, cfgs: []*rlsconfv3.RateLimitConfig{
			rlc("foo-1", "foo", desc("k1", "v1", policy(rlsconfv3.RateLimitUnit_MINUTE, 10))),
			rlc("foo-2", "foo", desc("k1", "v2", policy(rlsconfv3.RateLimitUnit_MINUTE, 100)))},
			want: []string{
				"foo.k1_v2: unit=MINUTE requests_per_unit=100, shadow_mode: false, quota_mode: false",
				"foo.k1_v1: unit=MINUTE requests_per_unit=10, shadow_mode: false, quota_mode: false"}},
	} {
		t.Run(tc.ref, func(t *testing.T) {
			c, err := config.FromProto(tc.cfgs, config.WithMergeDomains(tc.merge))
			if err != nil {
				t.Fatalf("FromProto: %v", err)
			}
			got := strings.Split(strings.TrimSuffix(c.String(), "\n"), "\n")
			slices.Sort(got)
			want := slices.Sorted(slices.Values(tc.want))
			if !slices.Equal(got, want) {
				t.Errorf("the rules (as /rlconfig lists them):\n%s\nwant (in any order):\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
			}
		})
	}
}
