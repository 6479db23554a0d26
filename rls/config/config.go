package config

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"google.golang.org/protobuf/types/known/structpb"

	"github.com/strictrate/strictrate/engine"
)

// MaxRequestsPerUnit is the largest requests_per_unit a rule may have: the most events the
// engine limits a key to (engine.MaxEvents, which a test ties it to). The reference accepts
// any uint32; a rule above this one is refused, since deciding it exactly is not possible and
// capping it in silence would deny what the rule admits. For no limit, a rule says
// unlimited: true.
const MaxRequestsPerUnit = 1<<31 - 1

// RateLimit is a rule's limit: what one matched descriptor is limited by. A Config's rules are
// shared by every Match that finds them: never modify one.
type RateLimit struct {
	// FullKey names the rule as the reference's stats do: the domain, then each level's key,
	// or key_value, joined by '.' ("edge.remote_address", "edge.path_/api/*").
	FullKey         string
	RequestsPerUnit uint32
	Unit            Unit
	// UnitMultiplier is the number of units in the rule's window when it is more than one
	// (rate_limit.unit_multiplier, this service's key: unit second and unit_multiplier 30 is
	// a window of 30 seconds); 0 for a window of one unit (no unit_multiplier, or 0, or 1).
	// Units and Window read it.
	UnitMultiplier uint32
	// Unlimited rules are never counted and always allow; their Replaces still apply.
	Unlimited bool
	// Name is the rule's name (rate_limit.name), which other rules' Replaces refer to.
	Name string
	// Replaces are the names of rules this one takes the place of: when a request's
	// descriptors match this rule, the rules so named are not applied to that request.
	Replaces []string
	// ShadowMode rules are decided and counted, but always answer OK.
	ShadowMode bool
	// QuotaMode rules never deny a request: over the limit, the descriptor answers OK (the
	// reference's quota_mode; the service decides what it answers).
	QuotaMode bool
	// RecordOverLimit rules count usage reported after the fact (record_over_limit, this
	// service's key, beside shadow_mode): a descriptor's hits are recorded whatever its limit
	// says, and answered over the limit when they did not fit, as the reference counts every
	// hit. The service decides what that means for a request (rls.WithRecordOverLimit names
	// rules the configuration cannot mark, those of xDS).
	RecordOverLimit bool
	// DetailedMetric rules are metered under the request's own values (see Match.StatKey).
	DetailedMetric bool
	// Metadata is the descriptor's metadata (a key of the reference's newer versions, which
	// return it to Envoy in the response's dynamic metadata): nil when it has none. Shared
	// with every Match of the rule: never modify it.
	Metadata *structpb.Struct
}

// Units is the number of units in the rule's window: its UnitMultiplier, or 1 when that is 0.
func (r *RateLimit) Units() uint32 { return max(1, r.UnitMultiplier) }

// Window is the length of the rule's window, Units times its unit's Duration (a month of 30
// days, a year of 365); 0 for a rule whose unit is unknown (an unlimited one).
func (r *RateLimit) Window() time.Duration {
	return time.Duration(r.Units()) * r.Unit.Duration()
}

// Entry is one entry of a request's descriptor, as Envoy sends it.
type Entry struct{ Key, Value string }

// Config is a loaded configuration: the rules of each domain. It is immutable, and safe for
// any number of goroutines. A nil *Config has no domains.
type Config struct {
	domains map[string]*node
}

// node is one level of a domain's descriptor tree. Children are found by the reference's
// composite key: "key_value", or "key" for an entry without a value.
type node struct {
	compositeKey   string // the key this node is found under in its parent
	children       map[string]*node
	order          []*node    // children in the order they were loaded, for String
	wildcards      []wildcard // children whose composite keys hold a '*', in load order
	limit          *RateLimit
	valueToMetric  bool
	shareThreshold bool
}

func newNode(key string) *node { return &node{compositeKey: key, children: map[string]*node{}} }

// Option changes how a configuration is built.
type Option func(*options)

type options struct {
	mergeDomains bool
	calendar     bool
}

// WithMergeDomains lets several files (or xDS resources) configure the same domain, their
// descriptors merged (the reference's MERGE_DOMAIN_CONFIG). A descriptor defined twice at the
// top of the domain is still refused. Without it, a domain named twice is refused.
func WithMergeDomains(on bool) Option { return func(o *options) { o.mergeDomains = on } }

// WithCalendar says the rules are decided with the units day, week, month and year as
// calendar periods (the service's rls.WithCalendar, STRICTRATE_CALENDAR=true). A calendar
// period is counted one at a time, from its start to the next (the engine has no period of
// several months, say), so a rule of several of them (a unit_multiplier above 1 on day,
// week, month or year) is refused, naming the rule; without it, such a rule is a sliding
// window of that many units' length.
func WithCalendar(on bool) Option { return func(o *options) { o.calendar = on } }

// File is one configuration file: its name (for messages) and its content.
type File struct {
	Name string
	Data []byte
}

// Parse builds a Config from files in the reference's YAML format, in the order given. Each
// file has one domain; an empty file, or one without a domain, is refused. Every refusal is an
// *Error wrapping ErrInvalid. No files make a Config without domains.
func Parse(files []File, opts ...Option) (*Config, error) {
	roots := make([]namedRoot, 0, len(files))
	for _, f := range files {
		root, err := parseYAML(f.Name, f.Data)
		if err != nil {
			return nil, err
		}
		roots = append(roots, namedRoot{f.Name, root})
	}
	return build(roots, opts)
}

type namedRoot struct {
	name string
	root *rawRoot
}

// build checks and loads the files' rules in order, as the reference does.
func build(roots []namedRoot, opts []Option) (*Config, error) {
	var o options
	for _, opt := range opts {
		opt(&o)
	}
	c := &Config{domains: map[string]*node{}}
	for _, r := range roots {
		if r.root.domain == "" {
			return nil, invalid(r.name, r.root.domainLine, "config file cannot have empty domain")
		}
		d, ok := c.domains[r.root.domain]
		if ok && !o.mergeDomains {
			return nil, invalid(r.name, r.root.domainLine, "duplicate domain '%s' in config file", r.root.domain)
		}
		if !ok {
			d = newNode("")
		}
		if err := d.load(r.name, r.root.domain+".", r.root.descriptors, &o); err != nil {
			return nil, err
		}
		c.domains[r.root.domain] = d
	}
	return c, nil
}

// load adds descriptors under n, checking each as the reference does and in its order: the
// key, a duplicate, the rate limit's unit (then, checks of our own, its requests_per_unit
// against MaxRequestsPerUnit and its unit_multiplier), its replaces, share_threshold, then
// (our own) record_over_limit, then the children.
func (n *node) load(file, parentKey string, ds []rawDescriptor, o *options) error {
	for _, d := range ds {
		if d.key == "" {
			return invalid(file, d.line, "descriptor has empty key")
		}
		ck := d.key
		if d.value != "" {
			ck += "_" + d.value
		}
		fullKey := parentKey + ck
		if _, dup := n.children[ck]; dup {
			return invalid(file, d.line, "duplicate descriptor composite key '%s'", fullKey)
		}
		child := newNode(ck)
		child.valueToMetric = d.valueToMetric
		child.shareThreshold = d.shareThreshold
		if rl := d.rateLimit; rl != nil {
			unit, unitErr := ParseUnit(rl.unit)
			if rl.unlimited && unitErr == nil {
				return invalid(file, rl.line, "should not specify rate limit unit when unlimited")
			}
			if !rl.unlimited && unitErr != nil {
				return invalid(file, rl.line, "invalid rate limit unit '%s'", rl.unit)
			}
			if !rl.unlimited && rl.requestsPerUnit > MaxRequestsPerUnit {
				line := rl.requestsLine
				if line == 0 {
					line = rl.line
				}
				return invalid(file, line, "requests_per_unit %d of '%s' is more than %d, the most a rule can limit exactly; lower it, or use unlimited: true for no limit",
					rl.requestsPerUnit, fullKey, MaxRequestsPerUnit)
			}
			if err := checkMultiplier(file, fullKey, rl, unit, o); err != nil {
				return err
			}
			for _, r := range rl.replaces {
				if r == "" {
					return invalid(file, rl.line, "should not have an empty replaces entry")
				}
				if r == rl.name {
					return invalid(file, rl.line, "replaces should not contain name of same descriptor")
				}
			}
			child.limit = &RateLimit{
				FullKey:         fullKey,
				RequestsPerUnit: rl.requestsPerUnit,
				Unit:            unit,
				UnitMultiplier:  multiplierOf(rl),
				Unlimited:       rl.unlimited,
				Name:            rl.name,
				Replaces:        slices.Clone(rl.replaces),
				ShadowMode:      d.shadowMode,
				QuotaMode:       d.quotaMode,
				DetailedMetric:  d.detailedMetric,
				Metadata:        d.metadata,
				RecordOverLimit: d.recordOverLimit,
			}
		}
		isWildcard := strings.Contains(ck, "*")
		if d.shareThreshold && !isWildcard {
			return invalid(file, d.line,
				"share_threshold can only be used with wildcard values (containing '*'), but found key '%s'", ck)
		}
		if err := checkRecord(file, fullKey, d); err != nil {
			return err
		}
		if isWildcard {
			n.wildcards = append(n.wildcards, newWildcard(ck))
		}
		if err := child.load(file, fullKey+".", d.descriptors, o); err != nil {
			return err
		}
		n.children[ck] = child
		n.order = append(n.order, child)
	}
	return nil
}

// checkMultiplier refuses a rule's unit_multiplier that cannot make its window: one that is
// not an integer of 0 or more, one beside unlimited (which has no unit), one that makes a
// window longer than the engine's engine.MaxWindow, and, under WithCalendar, one above 1 on
// a calendar unit.
func checkMultiplier(file, fullKey string, rl *rawRateLimit, unit Unit, o *options) error {
	if !rl.multiplierSet {
		return nil
	}
	line := rl.multiplierLine
	if line == 0 {
		line = rl.line
	}
	n := multiplierOf(rl)
	switch {
	case rl.badMultiplier:
		return invalid(file, line, "unit_multiplier %s of '%s' is not a whole number of units: write an integer of 1 or more (0, or none, is one unit)",
			rl.multiplierText, fullKey)
	case rl.unlimited && rl.multiplierText != "": // null is none
		return invalid(file, line, "should not specify unit_multiplier when unlimited ('%s')", fullKey)
	case n <= 1:
		return nil
	case time.Duration(n) > engine.MaxWindow/unit.Duration():
		return invalid(file, line, "unit_multiplier %s of '%s' makes a window of %s %ss, longer than the longest a rule can have (engine.MaxWindow, about 35 years)",
			rl.multiplierText, fullKey, rl.multiplierText, unit)
	case o.calendar && unit.CalendarPeriod() != 0:
		return invalid(file, line, "unit_multiplier %d of '%s': under calendar periods (STRICTRATE_CALENDAR=true) a %s is one calendar %s, counted from its start to the next, and %d of them cannot be counted as one; remove unit_multiplier, or turn calendar periods off to make it a sliding window of %d %ss",
			n, fullKey, unit, unit, n, n, unit)
	}
	return nil
}

// checkRecord refuses a record_over_limit: true that would record nothing: on a descriptor
// without a rate_limit (the descriptors below it do not inherit it, and their reports would be
// refused in silence) or on an unlimited one.
func checkRecord(file, fullKey string, d rawDescriptor) error {
	switch {
	case !d.recordOverLimit:
		return nil
	case d.rateLimit == nil:
		return invalid(file, d.recordLine, "record_over_limit of '%s' has no rate_limit beside it: it records the hits of its own descriptor's rule, and the descriptors below it do not inherit it; move it beside the rate_limit it is for",
			fullKey)
	case d.rateLimit.unlimited:
		return invalid(file, d.recordLine, "record_over_limit of '%s' is beside unlimited: true, which counts nothing; remove one of them", fullKey)
	}
	return nil
}

// multiplierOf is a rule's UnitMultiplier: its unit_multiplier when above 1, else 0.
func multiplierOf(rl *rawRateLimit) uint32 {
	if rl.multiplier <= 1 {
		return 0
	}
	return rl.multiplier
}

// Domains are the configured domains, sorted.
func (c *Config) Domains() []string {
	if c == nil {
		return nil
	}
	ds := make([]string, 0, len(c.domains))
	for d := range c.domains {
		ds = append(ds, d)
	}
	slices.Sort(ds)
	return ds
}

// Rules is how many rules the configuration holds, every domain's: the descriptors with a
// rate_limit, unlimited ones included (the lines String shows). The command logs it beside
// the domains when a configuration is loaded, so that an operator sees at a glance that the
// files or resources it meant were the ones read.
func (c *Config) Rules() int {
	if c == nil {
		return 0
	}
	n := 0
	for _, d := range c.domains {
		n += d.rules()
	}
	return n
}

// rules is how many rules n and the levels below it hold.
func (n *node) rules() int {
	count := 0
	if n.limit != nil {
		count++
	}
	for _, child := range n.order {
		count += child.rules()
	}
	return count
}

// HasDomain says whether the domain is configured (the reference counts requests for a domain
// it does not know in domain_not_found).
func (c *Config) HasDomain(domain string) bool {
	if c == nil {
		return false
	}
	_, ok := c.domains[domain]
	return ok
}

// String is the configuration as the reference's debug endpoint (/rlconfig) shows it: one line
// per rule, "<full key>: unit=<UNIT> requests_per_unit=<n>, shadow_mode: <bool>, quota_mode:
// <bool>", the domains sorted and each domain's rules in the order they were loaded, a parent
// before its children. A rule of several units (which the reference has not) shows them after
// its unit: "unit=SECOND unit_multiplier=30 requests_per_unit=<n>"; a rule with
// record_over_limit (neither has the reference) ends in ", record_over_limit: true".
func (c *Config) String() string {
	var b strings.Builder
	for _, d := range c.Domains() {
		c.domains[d].dump(&b)
	}
	return b.String()
}

func (n *node) dump(b *strings.Builder) {
	if l := n.limit; l != nil {
		multiplier := ""
		if l.Units() > 1 {
			multiplier = fmt.Sprintf(" unit_multiplier=%d", l.Units())
		}
		record := ""
		if l.RecordOverLimit {
			record = ", record_over_limit: true"
		}
		fmt.Fprintf(b, "%s: unit=%s%s requests_per_unit=%d, shadow_mode: %t, quota_mode: %t%s\n",
			l.FullKey, strings.ToUpper(l.Unit.String()), multiplier, l.RequestsPerUnit, l.ShadowMode, l.QuotaMode, record)
	}
	for _, child := range n.order {
		child.dump(b)
	}
}
