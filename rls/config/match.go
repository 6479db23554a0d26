package config

import "strings"

// Match is what a descriptor of a request is limited by.
type Match struct {
	// Limit is the rule that applies; nil when none does (the descriptor is not limited).
	Limit *RateLimit
	// Counter are the entries the rule's counter is kept under: the request's entries, with
	// the value of an entry matched by a share_threshold wildcard replaced by the wildcard
	// ("files/*"), so that every value it matches shares one counter. It may be the
	// request's own slice: do not modify it.
	Counter []Entry
	// StatKey names the rule in the metrics as the reference names it: Limit.FullKey, with
	// the request's values where the rule's detailed_metric, or a level's value_to_metric,
	// asks for them, and a share_threshold wildcard in place of the value it matched.
	StatKey string
	// PerValue says StatKey names values the request chose (an override's, a detailed_metric
	// rule's, a value_to_metric level's), so that a client sending ever new values would make
	// ever new series: the service keeps a bounded number of those, and names the rest
	// BoundedStatKey.
	PerValue bool
	// BoundedStatKey is the name of a PerValue match's series once the service keeps as many
	// of those as it may: the rule's stats key without the request's values (each level's key,
	// with its configured value or its wildcard's pattern), or, for an override, the domain
	// followed by ".limit_override". Empty when PerValue is false.
	BoundedStatKey string
}

// OverrideSeries is the last part of the stats key every override of a domain is counted
// under once the service keeps as many series named by requests' values as it may.
const OverrideSeries = "limit_override"

// step is how one entry of a request was matched.
type step struct {
	n        *node
	wildcard string // the wildcard child's composite key it matched, if any
	byValue  bool   // matched as "key_value" (exactly or by a wildcard), not by the key alone
}

// Match finds the rule for a descriptor's entries in domain, as the reference does. At each
// level, for the entry at that depth, it looks for the child "key_value"; failing that, the
// first wildcard child (in the order loaded) that "key_value" matches, each '*' of its key
// standing for any run of bytes ("bar*b", "files/*"); failing that, the child "key" (the key
// without a value). The rule applies when the last entry lands on a child with a rate_limit.
// There is no backtracking: when an entry lands on a child without children while entries
// remain, or on none, nothing applies. So a key and value without rate_limit, listed beside
// the key alone, exempts that value; a request with fewer entries than the tree is limited
// only by a rule at its own depth; one with more, by nothing.
func (c *Config) Match(domain string, entries []Entry) Match {
	if c == nil {
		return Match{}
	}
	level := c.domains[domain]
	if level == nil || len(entries) == 0 {
		return Match{}
	}
	var stepsBuf [8]step
	steps := stepsBuf[:0]
	var keyBuf [128]byte
	var found *RateLimit
	for i, e := range entries {
		ck := append(append(append(keyBuf[:0], e.Key...), '_'), e.Value...)
		next := level.children[string(ck)]
		s := step{}
		if next == nil {
			for _, w := range level.wildcards {
				if w.matches(ck) {
					next, s.wildcard = level.children[w.compositeKey], w.compositeKey
					break
				}
			}
		}
		s.byValue = next != nil
		if next == nil {
			next = level.children[e.Key]
		}
		if next == nil {
			return Match{}
		}
		s.n = next
		steps = append(steps, s)
		if i == len(entries)-1 {
			found = next.limit
		}
		if len(next.children) == 0 {
			break
		}
		level = next
	}
	if found == nil {
		return Match{}
	}

	// The counter's entries: a share_threshold wildcard's pattern in place of the value.
	counter := entries
	shared := false
	for i, s := range steps {
		if p, ok := s.sharedPattern(entries[i].Key); ok {
			if !shared {
				counter = append([]Entry(nil), entries...)
				shared = true
			}
			counter[i].Value = p
		}
	}
	m := Match{Limit: found, Counter: counter, StatKey: statKey(domain, entries, steps, found, shared, true)}
	if m.PerValue = perValue(steps, found); m.PerValue {
		m.BoundedStatKey = statKey(domain, entries, steps, found, shared, false)
	}
	return m
}

// perValue reports whether a rule's stats key, as matched by steps, names values the request
// chose: its detailed_metric, or a level's value_to_metric.
func perValue(steps []step, rule *RateLimit) bool {
	if rule.DetailedMetric {
		return true
	}
	for _, s := range steps {
		if s.n.valueToMetric {
			return true
		}
	}
	return false
}

// sharedPattern is the value part of the share_threshold wildcard the entry matched.
func (s step) sharedPattern(key string) (string, bool) {
	if s.wildcard == "" || !s.n.shareThreshold {
		return "", false
	}
	return strings.TrimPrefix(s.n.compositeKey, key+"_"), true
}

// statKey is the reference's stats key for a matched rule. With detailed_metric: every entry's
// key and value ("key_value", always with the '_'), or, when a share_threshold wildcard was
// matched, that wildcard's pattern for its entry and "key" or "key_value" for the others.
// Without: each level's key, followed by "_value" where the value is the configured one, the
// wildcard matched (its pattern, or, with share_threshold or value_to_metric, as below), or,
// for a level with value_to_metric, the request's value. With values false, no value the
// request chose is named: the key as if neither detailed_metric nor value_to_metric were set
// (Match.BoundedStatKey).
func statKey(domain string, entries []Entry, steps []step, rule *RateLimit, shared, values bool) string {
	detailed := rule.DetailedMetric && values
	var b strings.Builder
	b.Grow(keyLen(domain, entries))
	b.WriteString(domain)
	for i, s := range steps {
		e := entries[i]
		b.WriteByte('.')
		b.WriteString(e.Key)
		var v string
		switch {
		case detailed && shared:
			if p, ok := s.sharedPattern(e.Key); ok {
				v = p
			} else {
				v = e.Value
			}
		case detailed:
			b.WriteByte('_')
			v = e.Value
		case s.wildcard != "":
			if p, ok := s.sharedPattern(e.Key); ok {
				v = p
			} else if values && s.n.valueToMetric {
				v = e.Value
			} else {
				v = strings.TrimPrefix(s.wildcard, e.Key+"_")
			}
		case s.byValue, values && s.n.valueToMetric:
			v = e.Value
		}
		if v != "" {
			if !detailed || shared {
				b.WriteByte('_')
			}
			b.WriteString(v)
		}
	}
	return b.String()
}

// Override is the rule a request's own limit makes (RateLimitDescriptor.limit, sent by Envoy
// when a route's rate limit action sets it), as the reference makes it: requestsPerUnit per
// unit, named by the descriptor itself ("domain.key_value.key2", the '_value' left out for an
// empty value), counted under the request's entries, never unlimited, shadow or named, and
// whatever the configuration says of the descriptor. Only a configured domain gets one: in
// any other, nothing applies. A unit Envoy leaves unknown is returned as UnitUnknown, for the
// caller to handle (the service ignores such an override, and applies Match's rule). Unlike a
// rule, requestsPerUnit may be above MaxRequestsPerUnit: a request cannot be refused at load.
// The Limit is made for this call alone, shared with no other Match: the caller may set its
// UnitMultiplier (the override's unit_multiplier, of Envoy's newer API).
func (c *Config) Override(domain string, entries []Entry, requestsPerUnit uint32, unit Unit) Match {
	if !c.HasDomain(domain) {
		return Match{}
	}
	var b strings.Builder
	b.Grow(keyLen(domain, entries))
	b.WriteString(domain)
	b.WriteByte('.')
	for i, e := range entries {
		if i > 0 {
			b.WriteByte('.')
		}
		b.WriteString(e.Key)
		if e.Value != "" {
			b.WriteByte('_')
			b.WriteString(e.Value)
		}
	}
	key := b.String()
	return Match{
		Limit:          &RateLimit{FullKey: key, RequestsPerUnit: requestsPerUnit, Unit: unit},
		Counter:        entries,
		StatKey:        key,
		PerValue:       true,
		BoundedStatKey: domain + "." + OverrideSeries,
	}
}

// keyLen is the longest a stats key of the entries can be (a wildcard's pattern is never
// longer than the value it matched, less a few bytes).
func keyLen(domain string, entries []Entry) int {
	n := len(domain) + 1
	for _, e := range entries {
		n += len(e.Key) + len(e.Value) + 2
	}
	return n + 8
}
