package config_test

import (
	"reflect"
	"slices"
	"testing"

	"github.com/strictrate/strictrate/rls/config"
)

func parse(t *testing.T, files ...config.File) *config.Config {
	t.Helper()
	c, err := config.Parse(files)
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	return c
}

func yamlFile(name, data string) config.File { return config.File{Name: name, Data: []byte(data)} }

// e builds entries from key, value pairs.
func e(kv ...string) []config.Entry {
	var es []config.Entry
	for i := 0; i+1 < len(kv); i += 2 {
		es = append(es, config.Entry{Key: kv[i], Value: kv[i+1]})
	}
	return es
}

// want is what a test expects of a Match: nothing when rpu is 0 and unlimited false.
type want struct {
	rpu       uint32
	unit      config.Unit
	unlimited bool
	statKey   string
	counter   []config.Entry // nil: the request's entries
	name      string
	shadow    bool
	quota     bool
	metadata  map[string]any // the rule's metadata, as structpb.Struct.AsMap gives it; nil for none
}

type matchCase struct {
	name    string
	domain  string
	entries []config.Entry
	want    *want // nil: no rule applies
}

func runMatches(t *testing.T, c *config.Config, cases []matchCase) {
	t.Helper()
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			domain := tc.domain
			if domain == "" {
				domain = "test-domain"
			}
			m := c.Match(domain, tc.entries)
			if tc.want == nil {
				if m.Limit != nil {
					t.Fatalf("Match = %+v (stat %q), want no rule", *m.Limit, m.StatKey)
				}
				return
			}
			if m.Limit == nil {
				t.Fatalf("Match found no rule, want %+v", *tc.want)
			}
			w := tc.want
			l := m.Limit
			if l.RequestsPerUnit != w.rpu || l.Unit != w.unit || l.Unlimited != w.unlimited ||
				l.Name != w.name || l.ShadowMode != w.shadow || l.QuotaMode != w.quota {
				t.Errorf("rule = %+v, want %+v", *l, *w)
			}
			var metadata map[string]any
			if l.Metadata != nil {
				metadata = l.Metadata.AsMap()
			}
			if !reflect.DeepEqual(metadata, w.metadata) {
				t.Errorf("Metadata = %v, want %v", metadata, w.metadata)
			}
			if m.StatKey != w.statKey {
				t.Errorf("StatKey = %q, want %q", m.StatKey, w.statKey)
			}
			wantCounter := w.counter
			if wantCounter == nil {
				wantCounter = tc.entries
			}
			if !slices.Equal(m.Counter, wantCounter) {
				t.Errorf("Counter = %v, want %v", m.Counter, wantCounter)
			}
		})
	}
}

const basicYAML = `# The reference's basic layout.
domain: test-domain
descriptors:
  # A key and value without a limit of its own, with limits below it.
  - key: key1
    value: value1
    descriptors:
      - key: subkey1
        rate_limit:
          unit: second
          requests_per_unit: 5
      - key: subkey1
        value: subvalue1
        rate_limit:
          unit: second
          requests_per_unit: 10

  # The key alone, then values of it: the value is more specific.
  - key: key2
    rate_limit:
      unit: minute
      requests_per_unit: 20
  - key: key2
    value: value2
    rate_limit:
      unit: minute
      requests_per_unit: 30
  # A value without rate_limit: exempt from key2's limit.
  - key: key2
    value: value3

  - key: key3
    rate_limit:
      unit: hour
      requests_per_unit: 1
  - key: key4
    rate_limit:
      name: key4_rate_limit
      unit: day
      requests_per_unit: 1
  - key: key5
    value: value5
    rate_limit:
      unit: day
      requests_per_unit: 15
    descriptors:
      - key: subkey5
        value: subvalue5
        rate_limit:
          unit: day
          requests_per_unit: 25
  - key: key6
    rate_limit:
      unlimited: true
  - key: key7
    detailed_metric: true
    rate_limit:
      unit: minute
      requests_per_unit: 70
  - key: key8
    shadow_mode: true
    rate_limit: {unit: week, requests_per_unit: 8}
  - key: key9
    rate_limit: {unit: month, requests_per_unit: 9}
  - key: key10
    rate_limit: {unit: year, requests_per_unit: 10}
`

func TestMatchBasic(t *testing.T) {
	c := parse(t, yamlFile("basic.yaml", basicYAML))
	runMatches(t, c, []matchCase{
		{name: "unknown domain", domain: "foo_domain", entries: e("key2", "x")},
		{name: "no entries", entries: nil},
		{name: "value not configured, no key-only rule", entries: e("key1", "something")},
		{name: "key and value without a rule, request ends there", entries: e("key1", "value1")},
		{name: "more entries than the tree", entries: e("key2", "value2", "subkey", "subvalue")},
		{name: "no value match and no key-only child below", entries: e("key5", "value5", "subkey5", "subvalue")},
		{name: "rule at an inner node", entries: e("key5", "value5"),
			want: &want{rpu: 15, unit: config.Day, statKey: "test-domain.key5_value5"}},
		{name: "rule below it", entries: e("key5", "value5", "subkey5", "subvalue5"),
			want: &want{rpu: 25, unit: config.Day, statKey: "test-domain.key5_value5.subkey5_subvalue5"}},
		{name: "nested key-only", entries: e("key1", "value1", "subkey1", "something"),
			want: &want{rpu: 5, unit: config.Second, statKey: "test-domain.key1_value1.subkey1"}},
		{name: "nested key and value beats key-only", entries: e("key1", "value1", "subkey1", "subvalue1"),
			want: &want{rpu: 10, unit: config.Second, statKey: "test-domain.key1_value1.subkey1_subvalue1"}},
		{name: "key-only", entries: e("key2", "something"),
			want: &want{rpu: 20, unit: config.Minute, statKey: "test-domain.key2"}},
		{name: "empty value falls back on the key", entries: e("key2", ""),
			want: &want{rpu: 20, unit: config.Minute, statKey: "test-domain.key2"}},
		{name: "key and value beats key-only", entries: e("key2", "value2"),
			want: &want{rpu: 30, unit: config.Minute, statKey: "test-domain.key2_value2"}},
		{name: "key and value without rate_limit exempts", entries: e("key2", "value3")},
		{name: "hour", entries: e("key3", "foo"),
			want: &want{rpu: 1, unit: config.Hour, statKey: "test-domain.key3"}},
		{name: "named", entries: e("key4", "foo"),
			want: &want{rpu: 1, unit: config.Day, statKey: "test-domain.key4", name: "key4_rate_limit"}},
		{name: "unlimited", entries: e("key6", "foo"),
			want: &want{unlimited: true, statKey: "test-domain.key6"}},
		{name: "detailed metric names the value", entries: e("key7", "unspecified_value"),
			want: &want{rpu: 70, unit: config.Minute, statKey: "test-domain.key7_unspecified_value"}},
		{name: "detailed metric with an empty value keeps the '_'", entries: e("key7", ""),
			want: &want{rpu: 70, unit: config.Minute, statKey: "test-domain.key7_"}},
		{name: "shadow week", entries: e("key8", "x"),
			want: &want{rpu: 8, unit: config.Week, statKey: "test-domain.key8", shadow: true}},
		{name: "month", entries: e("key9", "x"),
			want: &want{rpu: 9, unit: config.Month, statKey: "test-domain.key9"}},
		{name: "year", entries: e("key10", "x"),
			want: &want{rpu: 10, unit: config.Year, statKey: "test-domain.key10"}},
	})
	if got := c.Domains(); !slices.Equal(got, []string{"test-domain"}) {
		t.Errorf("Domains = %v", got)
	}
	if !c.HasDomain("test-domain") || c.HasDomain("foo_domain") {
		t.Error("HasDomain is wrong")
	}
}

// wildcardYAML is the reference's wildcard layout, then cases of our own.
const wildcardYAML = `
domain: test-domain
descriptors:
  - key: wild
    value: foo*
    rate_limit: {unit: minute, requests_per_unit: 20}
  - key: noWild
    value: foo
    rate_limit: {unit: minute, requests_per_unit: 21}
  - key: noVal
    rate_limit: {unit: minute, requests_per_unit: 22}
  - key: midWild
    value: bar*b
    rate_limit: {unit: minute, requests_per_unit: 23}
  - key: multiWild
    value: foo*bar*baz
    rate_limit: {unit: minute, requests_per_unit: 25}
  - key: nestedWild
    value: val1
    descriptors:
      - key: wild
        value: goo*
        rate_limit: {unit: minute, requests_per_unit: 24}
  # Wildcards are tried in the order listed: the first that matches wins, not the longest.
  - key: order
    value: a*
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: order
    value: ab*
    rate_limit: {unit: second, requests_per_unit: 2}
  - key: order
    value: abc
    rate_limit: {unit: second, requests_per_unit: 3}
  # A wildcard beats the key alone.
  - key: any
    rate_limit: {unit: second, requests_per_unit: 4}
  - key: any
    value: "*"
    rate_limit: {unit: second, requests_per_unit: 5}
  # With value_to_metric, a wildcard's stats name the request's value.
  - key: vtm
    value: foo*
    value_to_metric: true
    rate_limit: {unit: second, requests_per_unit: 6}
`

func TestMatchWildcard(t *testing.T) {
	c := parse(t, yamlFile("wildcard.yaml", wildcardYAML))
	runMatches(t, c, []matchCase{
		{name: "key alone", entries: e("noVal", "foo1"),
			want: &want{rpu: 22, unit: config.Minute, statKey: "test-domain.noVal"}},
		{name: "wildcard", entries: e("wild", "foo1"),
			want: &want{rpu: 20, unit: config.Minute, statKey: "test-domain.wild_foo*"}},
		{name: "wildcard, prefix itself", entries: e("wild", "foo"),
			want: &want{rpu: 20, unit: config.Minute, statKey: "test-domain.wild_foo*"}},
		{name: "nested wildcard", entries: e("nestedWild", "val1", "wild", "goo2"),
			want: &want{rpu: 24, unit: config.Minute, statKey: "test-domain.nestedWild_val1.wild_goo*"}},
		{name: "wildcard does not match", entries: e("wild", "bar")},
		{name: "plain value is no prefix", entries: e("noWild", "foo1")},
		{name: "'*' in the middle", entries: e("midWild", "barab"),
			want: &want{rpu: 23, unit: config.Minute, statKey: "test-domain.midWild_bar*b"}},
		{name: "'*' in the middle matches nothing too", entries: e("midWild", "barb"),
			want: &want{rpu: 23, unit: config.Minute, statKey: "test-domain.midWild_bar*b"}},
		{name: "'*' in the middle, suffix missing", entries: e("midWild", "bara")},
		{name: "several '*', in order", entries: e("multiWild", "fooXbarYbaz"),
			want: &want{rpu: 25, unit: config.Minute, statKey: "test-domain.multiWild_foo*bar*baz"}},
		{name: "several '*', out of order", entries: e("multiWild", "foobazbar")},
		{name: "several '*', the parts overlapping", entries: e("multiWild", "foobaz")},
		{name: "exact value first", entries: e("order", "abc"),
			want: &want{rpu: 3, unit: config.Second, statKey: "test-domain.order_abc"}},
		{name: "first listed wildcard", entries: e("order", "abd"),
			want: &want{rpu: 1, unit: config.Second, statKey: "test-domain.order_a*"}},
		{name: "'*' beats the key alone", entries: e("any", "x"),
			want: &want{rpu: 5, unit: config.Second, statKey: "test-domain.any_*"}},
		{name: "'*' matches an empty value", entries: e("any", ""),
			want: &want{rpu: 5, unit: config.Second, statKey: "test-domain.any_*"}},
		{name: "value_to_metric on a wildcard", entries: e("vtm", "foo7"),
			want: &want{rpu: 6, unit: config.Second, statKey: "test-domain.vtm_foo7"}},
	})
}

// shareYAML is the reference's share_threshold layout (its newer one, with wildcards in the
// middle of values).
const shareYAML = `
domain: test-domain
descriptors:
  - key: files
    value: files/*
    share_threshold: true
    rate_limit: {unit: minute, requests_per_unit: 100}
  - key: nested
    value: parent
    descriptors:
      - key: files
        value: nested/*
        share_threshold: true
        rate_limit: {unit: minute, requests_per_unit: 200}
  - key: files
    value: top/*
    share_threshold: true
    descriptors:
      - key: files
        value: nested/*
        share_threshold: true
        rate_limit: {unit: minute, requests_per_unit: 300}
  - key: route
    value: api/*
    share_threshold: true
    value_to_metric: true
    descriptors:
      - key: method
        rate_limit: {unit: minute, requests_per_unit: 60}
  - key: service
    value: svc/*
    share_threshold: true
    descriptors:
      - key: endpoint
        detailed_metric: true
        rate_limit: {unit: minute, requests_per_unit: 80}
  - key: path
    value: path/*
    share_threshold: true
    descriptors:
      - key: file
        value: file/*
        share_threshold: false
        descriptors:
          - key: type
            rate_limit: {unit: minute, requests_per_unit: 120}
  - key: user
    value: user/*
    share_threshold: true
    descriptors:
      - key: resource
        value: res/*
        share_threshold: true
        descriptors:
          - key: action
            rate_limit: {unit: minute, requests_per_unit: 150}
  - key: file
    value: test1
    rate_limit: {unit: minute, requests_per_unit: 50}
  - key: file
    value: test*
    share_threshold: true
    rate_limit: {unit: minute, requests_per_unit: 100}
  - {key: midpath, value: /api*v1, share_threshold: true, rate_limit: {unit: minute, requests_per_unit: 100}}
  - {key: multiroute, value: svc*ep*rpc, share_threshold: true, rate_limit: {unit: minute, requests_per_unit: 50}}
  - {key: midroute, value: /api*v2, share_threshold: true, value_to_metric: true, rate_limit: {unit: minute, requests_per_unit: 80}}
  - key: tenant
    value: t*prod
    share_threshold: true
    descriptors:
      - {key: resource, value: res*v2, share_threshold: true, rate_limit: {unit: minute, requests_per_unit: 60}}
`

func TestMatchShareThreshold(t *testing.T) {
	c := parse(t, yamlFile("share.yaml", shareYAML))
	var cases []matchCase
	for _, v := range []string{"files/a.pdf", "files/b.csv"} {
		cases = append(cases, matchCase{name: "shared " + v, entries: e("files", v),
			want: &want{rpu: 100, unit: config.Minute, statKey: "test-domain.files_files/*", counter: e("files", "files/*")}})
	}
	cases = append(cases,
		matchCase{name: "value_to_metric yields to share_threshold", entries: e("route", "api/v1", "method", "GET"),
			want: &want{rpu: 60, unit: config.Minute, statKey: "test-domain.route_api/*.method",
				counter: e("route", "api/*", "method", "GET")}},
		matchCase{name: "detailed_metric with share_threshold", entries: e("service", "svc/user", "endpoint", "get"),
			want: &want{rpu: 80, unit: config.Minute, statKey: "test-domain.service_svc/*.endpoint_get",
				counter: e("service", "svc/*", "endpoint", "get")}},
		matchCase{name: "nested", entries: e("nested", "parent", "files", "nested/file1.txt"),
			want: &want{rpu: 200, unit: config.Minute, statKey: "test-domain.nested_parent.files_nested/*",
				counter: e("nested", "parent", "files", "nested/*")}},
		matchCase{name: "same key at two levels", entries: e("files", "top/file1.txt", "files", "nested/file1.txt"),
			want: &want{rpu: 300, unit: config.Minute, statKey: "test-domain.files_top/*.files_nested/*",
				counter: e("files", "top/*", "files", "nested/*")}},
		matchCase{name: "shared parent, unshared wildcard child", entries: e("path", "path/foo", "file", "file/doc1", "type", "pdf"),
			want: &want{rpu: 120, unit: config.Minute, statKey: "test-domain.path_path/*.file_file/*.type",
				counter: e("path", "path/*", "file", "file/doc1", "type", "pdf")}},
		matchCase{name: "both shared", entries: e("user", "user/alice", "resource", "res/file1", "action", "read"),
			want: &want{rpu: 150, unit: config.Minute, statKey: "test-domain.user_user/*.resource_res/*.action",
				counter: e("user", "user/*", "resource", "res/*", "action", "read")}},
		matchCase{name: "explicit value keeps its own counter", entries: e("file", "test1"),
			want: &want{rpu: 50, unit: config.Minute, statKey: "test-domain.file_test1"}},
		matchCase{name: "other values share", entries: e("file", "test123"),
			want: &want{rpu: 100, unit: config.Minute, statKey: "test-domain.file_test*", counter: e("file", "test*")}},
	)
	runMatches(t, c, cases)

	// The request's entries are not modified when a shared counter replaces a value.
	req := e("files", "files/a.pdf")
	c.Match("test-domain", req)
	if req[0].Value != "files/a.pdf" {
		t.Errorf("Match modified the request: %v", req)
	}
}

func TestMatchMetricNames(t *testing.T) {
	c := parse(t, yamlFile("metrics.yaml", `
domain: nested
descriptors:
  - key: key-1
    detailed_metric: true
    rate_limit: {unit: minute, requests_per_unit: 100}
    descriptors:
      - key: key-2
        detailed_metric: true
        rate_limit: {unit: minute, requests_per_unit: 5}
  - key: plain-1
    rate_limit: {unit: minute, requests_per_unit: 100}
    descriptors:
      - key: plain-2
        rate_limit: {unit: minute, requests_per_unit: 5}
  - key: route
    value_to_metric: true
    descriptors:
      - key: http_method
        value_to_metric: true
        descriptors:
          - key: subject_id
            rate_limit: {unit: minute, requests_per_unit: 60}
      - key: http_method
        value: POST
        descriptors:
          - key: subject_id
            rate_limit: {unit: minute, requests_per_unit: 30}
  - key: k1
    descriptors:
      - key: k2
        value_to_metric: true
        descriptors:
          - key: k3
            rate_limit: {unit: second, requests_per_unit: 1}
  - key: d1
    value_to_metric: true
    descriptors:
      - key: d2
        detailed_metric: true
        rate_limit: {unit: second, requests_per_unit: 2}
  - key: wild
    value: foo*
    descriptors:
      - key: other
        value_to_metric: true
        descriptors:
          - key: limit
            rate_limit: {unit: minute, requests_per_unit: 20}
`))
	d := "nested"
	runMatches(t, c, []matchCase{
		{name: "detailed, top level only", domain: d, entries: e("key-1", "value-1"),
			want: &want{rpu: 100, unit: config.Minute, statKey: "nested.key-1_value-1"}},
		{name: "detailed, nested", domain: d, entries: e("key-1", "value-1", "key-2", "value-2"),
			want: &want{rpu: 5, unit: config.Minute, statKey: "nested.key-1_value-1.key-2_value-2"}},
		{name: "not detailed, nested", domain: d, entries: e("plain-1", "value-1", "plain-2", "value-2"),
			want: &want{rpu: 5, unit: config.Minute, statKey: "nested.plain-1.plain-2"}},
		{name: "value_to_metric", domain: d, entries: e("route", "draw", "http_method", "GET", "subject_id", "123"),
			want: &want{rpu: 60, unit: config.Minute, statKey: "nested.route_draw.http_method_GET.subject_id"}},
		{name: "value_to_metric and a configured value", domain: d, entries: e("route", "api", "http_method", "POST", "subject_id", "1"),
			want: &want{rpu: 30, unit: config.Minute, statKey: "nested.route_api.http_method_POST.subject_id"}},
		{name: "value_to_metric with empty values", domain: d, entries: e("route", "", "http_method", "", "subject_id", "123"),
			want: &want{rpu: 60, unit: config.Minute, statKey: "nested.route.http_method.subject_id"}},
		{name: "value_to_metric mid level", domain: d, entries: e("k1", "X", "k2", "Y", "k3", "Z"),
			want: &want{rpu: 1, unit: config.Second, statKey: "nested.k1.k2_Y.k3"}},
		{name: "detailed_metric wins over value_to_metric", domain: d, entries: e("d1", "a", "d2", "b"),
			want: &want{rpu: 2, unit: config.Second, statKey: "nested.d1_a.d2_b"}},
		{name: "wildcard kept beside value_to_metric elsewhere", domain: d, entries: e("wild", "foo1", "other", "bar", "limit", "X"),
			want: &want{rpu: 20, unit: config.Minute, statKey: "nested.wild_foo*.other_bar.limit"}},
	})
}

func TestMatchReplacesAndModes(t *testing.T) {
	c := parse(t, yamlFile("replaces.yaml", `
domain: d
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 10, name: per_user}
  - key: vip
    quota_mode: true
    rate_limit:
      unit: minute
      requests_per_unit: 100
      replaces:
        - name: per_user
        - name: other
`))
	m := c.Match("d", e("vip", "x"))
	if m.Limit == nil || !slices.Equal(m.Limit.Replaces, []string{"per_user", "other"}) || !m.Limit.QuotaMode || m.Limit.Name != "" {
		t.Fatalf("vip rule = %+v", m.Limit)
	}
	if m := c.Match("d", e("user", "u")); m.Limit == nil || m.Limit.Name != "per_user" || len(m.Limit.Replaces) != 0 {
		t.Fatalf("user rule = %+v", m.Limit)
	}
}

func TestOverride(t *testing.T) {
	c := parse(t, yamlFile("basic.yaml", basicYAML))
	if m := c.Override("foo_domain", e("key1", "value1"), 10, config.Day); m.Limit != nil {
		t.Fatalf("override in an unknown domain = %+v", *m.Limit)
	}
	entries := e("key1", "value1", "subkey1", "something")
	m := c.Override("test-domain", entries, 10, config.Day)
	if m.Limit == nil {
		t.Fatal("no override")
	}
	wantRule := config.RateLimit{FullKey: "test-domain.key1_value1.subkey1_something", RequestsPerUnit: 10, Unit: config.Day}
	if m.Limit.FullKey != wantRule.FullKey || m.Limit.RequestsPerUnit != 10 || m.Limit.Unit != config.Day ||
		m.Limit.Unlimited || m.Limit.ShadowMode || m.Limit.Name != "" || len(m.Limit.Replaces) != 0 {
		t.Errorf("override = %+v, want %+v", *m.Limit, wantRule)
	}
	if m.StatKey != wantRule.FullKey || !slices.Equal(m.Counter, entries) {
		t.Errorf("override StatKey %q Counter %v", m.StatKey, m.Counter)
	}
	// An empty value leaves out its '_'; a configured shadow or unlimited rule does not carry over.
	m = c.Override("test-domain", e("key6", "", "b", "c"), 3, config.Hour)
	if m.StatKey != "test-domain.key6.b_c" || m.Limit.Unlimited {
		t.Errorf("override = %+v, %q", *m.Limit, m.StatKey)
	}
}

func TestNilConfig(t *testing.T) {
	var c *config.Config
	if m := c.Match("d", e("a", "b")); m.Limit != nil {
		t.Error("nil config matched")
	}
	if m := c.Override("d", e("a", "b"), 1, config.Second); m.Limit != nil {
		t.Error("nil config overrode")
	}
	if len(c.Domains()) != 0 || c.String() != "" || c.HasDomain("d") {
		t.Error("nil config has domains")
	}
}

func TestString(t *testing.T) {
	c := parse(t,
		yamlFile("b.yaml", `
domain: b
descriptors:
  - key: k
    value: v
    descriptors:
      - key: sub
        shadow_mode: true
        rate_limit: {unit: second, requests_per_unit: 5}
  - key: free
    rate_limit: {unlimited: true}
  - key: q
    quota_mode: true
    rate_limit: {unit: year, requests_per_unit: 1}
`),
		yamlFile("a.yaml", `
domain: a
descriptors:
  - key: x
    rate_limit: {unit: minute, requests_per_unit: 10}
`))
	want := "a.x: unit=MINUTE requests_per_unit=10, shadow_mode: false, quota_mode: false\n" +
		"b.k_v.sub: unit=SECOND requests_per_unit=5, shadow_mode: true, quota_mode: false\n" +
		"b.free: unit=UNKNOWN requests_per_unit=0, shadow_mode: false, quota_mode: false\n" +
		"b.q: unit=YEAR requests_per_unit=1, shadow_mode: false, quota_mode: true\n"
	if got := c.String(); got != want {
		t.Errorf("String =\n%s\nwant\n%s", got, want)
	}
}

func BenchmarkMatch(b *testing.B) {
	c, err := config.Parse([]config.File{yamlFile("share.yaml", shareYAML)})
	if err != nil {
		b.Fatal(err)
	}
	req := e("user", "user/alice", "resource", "res/file1", "action", "read")
	b.ReportAllocs()
	for b.Loop() {
		c.Match("test-domain", req)
	}
}
