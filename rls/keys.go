package rls

import (
	"strings"

	"github.com/strictrate/strictrate/rls/config"
)

// keyEscaper makes a descriptor's parts safe to join with '_': a key or value holding '_' or
// '%' cannot make two descriptors share a key, and one holding a brace cannot choose a
// cluster slot through a hash tag.
var keyEscaper = strings.NewReplacer("%", "%25", "_", "%5F", "{", "%7B", "}", "%7D")

// counterKey is the engine key of a descriptor's counter: the prefix, the domain, then each
// entry's key and value (a share_threshold wildcard's pattern in place of the value), every
// part escaped and followed by '_', as the reference names its keys but without the window's
// start (a sliding log has no fixed windows) and unambiguous.
func counterKey(prefix, domain string, entries []config.Entry) string {
	var b strings.Builder
	b.Grow(len(prefix) + len(domain) + 1 + 16*len(entries))
	b.WriteString(prefix)
	b.WriteString(keyEscaper.Replace(domain))
	b.WriteByte('_')
	for _, e := range entries {
		b.WriteString(keyEscaper.Replace(e.Key))
		b.WriteByte('_')
		b.WriteString(keyEscaper.Replace(e.Value))
		b.WriteByte('_')
	}
	return b.String()
}
