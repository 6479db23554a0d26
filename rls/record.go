package rls

import "strings"

// recordNames are the rules WithRecordOverLimit names, by their stats names (config.RateLimit's
// FullKey): exact ones, and prefixes (a name ending in '*'). The zero value names none, and
// costs a decision nothing.
type recordNames struct {
	exact    map[string]bool
	prefixes []string
}

// add names to n.
func (n *recordNames) add(names []string) {
	for _, name := range names {
		switch prefix, ok := strings.CutSuffix(name, "*"); {
		case ok:
			n.prefixes = append(n.prefixes, prefix)
		case name != "":
			if n.exact == nil {
				n.exact = map[string]bool{}
			}
			n.exact[name] = true
		}
	}
}

// match reports whether the rule of stats name fullKey is named.
func (n recordNames) match(fullKey string) bool {
	if n.exact[fullKey] {
		return true
	}
	for _, p := range n.prefixes {
		if strings.HasPrefix(fullKey, p) {
			return true
		}
	}
	return false
}
