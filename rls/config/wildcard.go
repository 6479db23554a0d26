package config

import "bytes"

// wildcard is a child whose composite key ("key_value") holds a '*': each '*' stands for any
// run of bytes, the empty one included, so "path_/api/*" is a prefix, "route_bar*b" a prefix
// and a suffix, "svc_a*b*c" the parts in that order. The pinned reference read only a '*' at
// the end; its newer versions read one anywhere, and so does this package, so that a file
// written for them is not read literally here (a "bar*b" that loads and never matches).
type wildcard struct {
	compositeKey string   // the child's key in its parent
	parts        [][]byte // compositeKey split at each '*': at least two
	fixed        int      // the bytes of parts together: the shortest key that can match
}

func newWildcard(compositeKey string) wildcard {
	parts := bytes.Split([]byte(compositeKey), []byte("*"))
	w := wildcard{compositeKey: compositeKey, parts: parts}
	for _, p := range parts {
		w.fixed += len(p)
	}
	return w
}

// matches reports whether a request's composite key ck matches the pattern, as the reference
// matches it: ck starts with the first part and ends with the last, and the parts between
// them appear in order, each after the one before, in what the two ends leave. It allocates
// nothing: it runs for every wildcard tried of every descriptor.
func (w wildcard) matches(ck []byte) bool {
	first, last := w.parts[0], w.parts[len(w.parts)-1]
	if len(ck) < w.fixed || !bytes.HasPrefix(ck, first) || !bytes.HasSuffix(ck, last) {
		return false
	}
	rest := ck[len(first) : len(ck)-len(last)]
	for _, p := range w.parts[1 : len(w.parts)-1] {
		i := bytes.Index(rest, p)
		if i < 0 {
			return false
		}
		rest = rest[i+len(p):]
	}
	return true
}
