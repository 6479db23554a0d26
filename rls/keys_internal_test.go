package rls

import (
	"strings"
	"testing"

	"github.com/strictrate/strictrate/rls/config"
)

// CounterKey is the engine key (without the engine's prefix) of the counter of a descriptor
// whose entries are the key/value pairs kv, in domain, under the service's key prefix: what
// the tests of package rls_test read back from Valkey.
func CounterKey(prefix, domain string, kv ...string) string {
	entries := make([]config.Entry, 0, len(kv)/2)
	for i := 0; i+1 < len(kv); i += 2 {
		entries = append(entries, config.Entry{Key: kv[i], Value: kv[i+1]})
	}
	return counterKey(prefix, domain, entries)
}

// Descriptors whose parts joined with '_' would read alike get keys of their own, and no part
// can choose a cluster slot through a hash tag.
func TestCounterKeyIsUnambiguous(t *testing.T) {
	descriptors := [][]string{
		{"d", "a", "b_c"},
		{"d", "a_b", "c"},
		{"d_a", "b", "c"},
		{"d", "a", "b", "c", ""},
		{"d", "a", "b%5Fc"},
		{"d", "a", "b%c"},
		{"d", "a", "b%25c"},
		{"d", "a", "{b}"},
		{"d", "a", "%7Bb%7D"},
		{"d", "a", ""},
		{"d", "", "a"},
	}
	seen := map[string][]string{}
	for _, d := range descriptors {
		k := CounterKey("p:", d[0], d[1:]...)
		if other, ok := seen[k]; ok {
			t.Errorf("%q and %q share the key %q", other, d, k)
		}
		seen[k] = d
		if strings.ContainsAny(k, "{}") {
			t.Errorf("%q: key %q holds a brace, a hash tag could choose its slot", d, k)
		}
		if !strings.HasPrefix(k, "p:") {
			t.Errorf("%q: key %q lacks the prefix", d, k)
		}
	}
}

// FieldsKept is how many limits' header fields s keeps: what the tests of package rls_test
// read to see that clients cannot grow it.
func FieldsKept(s *Service) int {
	n := 0
	s.fields.Range(func(any, any) bool {
		n++
		return true
	})
	return n
}
