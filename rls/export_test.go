package rls

import "github.com/strictrate/strictrate/rls/config"

// CounterKey is the engine key (without the engine's prefix) of the counter of a descriptor
// whose entries are the key/value pairs kv, in domain, under the service's key prefix: what
// the tests read back from Valkey.
func CounterKey(prefix, domain string, kv ...string) string {
	entries := make([]config.Entry, 0, len(kv)/2)
	for i := 0; i+1 < len(kv); i += 2 {
		entries = append(entries, config.Entry{Key: kv[i], Value: kv[i+1]})
	}
	return counterKey(prefix, domain, entries)
}
