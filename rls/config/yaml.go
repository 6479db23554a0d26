package config

import (
	"math"
	"strings"

	"go.yaml.in/yaml/v3"
	"google.golang.org/protobuf/types/known/structpb"
)

// The file's content as the reference reads it, before the rules are checked and built; the
// xDS resources are turned into the same.
type rawRoot struct {
	domain      string
	domainLine  int
	descriptors []rawDescriptor
}

type rawDescriptor struct {
	line           int
	key, value     string
	rateLimit      *rawRateLimit
	descriptors    []rawDescriptor
	shadowMode     bool
	quotaMode      bool
	detailedMetric bool
	valueToMetric  bool
	shareThreshold bool
	metadata       *structpb.Struct

	// record_over_limit, this service's key (the reference has none): the rule records hits
	// over its limit (RateLimit.RecordOverLimit); recordLine is its line, for a refusal.
	recordOverLimit bool
	recordLine      int
}

type rawRateLimit struct {
	line            int
	requestsLine    int // the line of requests_per_unit; 0 when not known (absent, or xDS)
	requestsPerUnit uint32
	unit            string
	unlimited       bool
	name            string
	replaces        []string
	// unit_multiplier, this service's key (the reference has none): the number of units in
	// the rule's window, 0 when absent or null; whether the key was given, its line and its
	// value as written; and badMultiplier when that is not an integer of 0 or more, for the
	// rule to refuse by its name.
	multiplier     uint32
	multiplierSet  bool
	multiplierLine int
	multiplierText string
	badMultiplier  bool
}

// knownKeys are the keys the reference accepts (metadata since its newer versions), at any
// depth of a file: it checks every key against one set, so a key in the wrong place ("unit"
// beside "key", say) is accepted and ignored, as it is here. unit_multiplier is this
// service's own, and belongs in a rate_limit: anywhere else it is refused, since a window
// silently left one unit long would admit many times what the rule says. record_over_limit is
// this service's too, and belongs beside a descriptor's key, as shadow_mode: in a rate_limit
// or beside the domain it is refused, since reports silently refused would go uncounted.
var knownKeys = map[string]bool{
	"domain": true, "key": true, "value": true, "descriptors": true, "rate_limit": true,
	"unit": true, "requests_per_unit": true, "unlimited": true, "shadow_mode": true,
	"quota_mode": true, "name": true, "replaces": true, "detailed_metric": true,
	"value_to_metric": true, "share_threshold": true, "metadata": true,
	"unit_multiplier": true, "record_over_limit": true,
}

// maxNodes bounds the nodes a file may expand to through aliases, so that a small file of
// nested aliases cannot take the process's time; maxDepth bounds the nesting of maps, so that
// an alias that contains itself is refused.
const (
	maxNodes = 1 << 20
	maxDepth = 256
)

// yamlReader decodes one file. It reads the YAML tree itself rather than through struct
// tags so that it accepts exactly what the reference accepts (its YAML 1.1 booleans, a key
// given twice where the last wins, merge keys) and can say on which line a refusal is.
type yamlReader struct {
	file  string
	nodes int
	open  map[*yaml.Node]bool // aliases being expanded, to refuse a cycle
}

// parseYAML reads one file of the reference's format.
func parseYAML(file string, data []byte) (*rawRoot, error) {
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return nil, invalid(file, 0, "error loading config file: %v", err)
	}
	r := &yamlReader{file: file, open: map[*yaml.Node]bool{}}
	root := &doc
	if root.Kind == yaml.DocumentNode {
		if len(root.Content) == 0 {
			return &rawRoot{}, nil
		}
		root = root.Content[0]
	}
	root, err := r.deref(root)
	if err != nil {
		return nil, err
	}
	switch {
	case root.Kind == 0 || isNull(root):
		return &rawRoot{}, nil
	case root.Kind != yaml.MappingNode:
		return nil, r.typeErr(root, "a map")
	}
	if err := r.checkKeys(root, 0); err != nil {
		return nil, err
	}
	return r.root(root)
}

// deref follows an alias to the node it names.
func (r *yamlReader) deref(n *yaml.Node) (*yaml.Node, error) {
	for n.Kind == yaml.AliasNode {
		if n.Alias == nil {
			return nil, invalid(r.file, n.Line, "error loading config file: unknown anchor '%s'", n.Value)
		}
		n = n.Alias
	}
	r.nodes++
	if r.nodes > maxNodes {
		return nil, invalid(r.file, n.Line, "error loading config file: document expands to more than %d nodes", maxNodes)
	}
	return n, nil
}

type pair struct{ key, value *yaml.Node }

// pairs are a map's keys and values in order, with merge keys ("<<: *defaults") expanded
// first so that the map's own keys, coming later, win.
func (r *yamlReader) pairs(m *yaml.Node) ([]pair, error) {
	if r.open[m] {
		return nil, invalid(r.file, m.Line, "error loading config file: anchor value contains itself")
	}
	r.open[m] = true
	defer delete(r.open, m)
	var merged, own []pair
	for i := 0; i+1 < len(m.Content); i += 2 {
		k, err := r.deref(m.Content[i])
		if err != nil {
			return nil, err
		}
		if k.Kind == yaml.ScalarNode && k.ShortTag() == "!!merge" {
			ps, err := r.merge(m.Content[i+1])
			if err != nil {
				return nil, err
			}
			merged = append(merged, ps...)
			continue
		}
		own = append(own, pair{k, m.Content[i+1]})
	}
	return append(merged, own...), nil
}

// merge is the content of a merge key: a map, or a list of maps of which the first wins.
func (r *yamlReader) merge(v *yaml.Node) ([]pair, error) {
	v, err := r.deref(v)
	if err != nil {
		return nil, err
	}
	switch v.Kind {
	case yaml.MappingNode:
		return r.pairs(v)
	case yaml.SequenceNode:
		var all []pair
		for i := len(v.Content) - 1; i >= 0; i-- {
			m, err := r.deref(v.Content[i])
			if err != nil {
				return nil, err
			}
			if m.Kind != yaml.MappingNode {
				return nil, invalid(r.file, m.Line, "error loading config file: map merge requires map or sequence of maps as the value")
			}
			ps, err := r.pairs(m)
			if err != nil {
				return nil, err
			}
			all = append(all, ps...)
		}
		return all, nil
	}
	return nil, invalid(r.file, v.Line, "error loading config file: map merge requires map or sequence of maps as the value")
}

// checkKeys is the reference's check of a whole file before it is read: every key a string
// it knows, every list a list of maps, every value a string, an integer, a boolean or null.
func (r *yamlReader) checkKeys(m *yaml.Node, depth int) error {
	if depth > maxDepth {
		return invalid(r.file, m.Line, "error loading config file: maps nested more than %d deep", maxDepth)
	}
	ps, err := r.pairs(m)
	if err != nil {
		return err
	}
	for _, p := range ps {
		if p.key.Kind != yaml.ScalarNode || p.key.ShortTag() != "!!str" {
			return invalid(r.file, p.key.Line, "config error, key is not of type string: %s", show(p.key))
		}
		if !knownKeys[p.key.Value] {
			return invalid(r.file, p.key.Line, "config error, unknown key '%s'", p.key.Value)
		}
		if p.key.Value == "metadata" {
			continue // free-form, as the newer reference leaves it: read with its descriptor
		}
		if p.key.Value == "unit_multiplier" {
			continue // checked with its rule, so that a refusal names the rule
		}
		v, err := r.deref(p.value)
		if err != nil {
			return err
		}
		switch v.Kind {
		case yaml.SequenceNode:
			for _, e := range v.Content {
				e, err := r.deref(e)
				if err != nil {
					return err
				}
				if e.Kind != yaml.MappingNode {
					return invalid(r.file, e.Line, "config error, yaml file contains list of type other than map: %s", show(e))
				}
				if err := r.checkKeys(e, depth+1); err != nil {
					return err
				}
			}
		case yaml.MappingNode:
			if err := r.checkKeys(v, depth+1); err != nil {
				return err
			}
		case yaml.ScalarNode:
			if !leaf(v) {
				return invalid(r.file, v.Line, "error checking config: the value %s of '%s' is a %s, not a string, an integer or a boolean",
					v.Value, p.key.Value, strings.TrimPrefix(v.ShortTag(), "!!"))
			}
		}
	}
	return nil
}

// leaf says whether a scalar is one the reference lets through its check: a string, an integer
// that fits 64 bits, a boolean, null (a timestamp or binary is read as a string there).
func leaf(n *yaml.Node) bool {
	switch n.ShortTag() {
	case "!!str", "!!bool", "!!null", "!!timestamp", "!!binary":
		return true
	case "!!int":
		var i int64
		return n.Decode(&i) == nil
	}
	return false
}

func isNull(n *yaml.Node) bool { return n.Kind == yaml.ScalarNode && n.ShortTag() == "!!null" }

// show is a node as the reference's messages print it.
func show(n *yaml.Node) string {
	switch {
	case isNull(n):
		return "<nil>"
	case n.Kind == yaml.ScalarNode:
		return n.Value
	case n.Kind == yaml.SequenceNode:
		return "a list"
	}
	return "a map"
}

func (r *yamlReader) typeErr(n *yaml.Node, want string) error {
	got := n.ShortTag()
	if n.Kind == yaml.ScalarNode {
		got += " `" + n.Value + "`"
	}
	return invalid(r.file, n.Line, "error loading config file: cannot unmarshal %s into %s", got, want)
}

func (r *yamlReader) root(m *yaml.Node) (*rawRoot, error) {
	ps, err := r.pairs(m)
	if err != nil {
		return nil, err
	}
	root := &rawRoot{}
	for _, p := range ps {
		switch p.key.Value {
		case "domain":
			if root.domain, err = r.str(p.value); err != nil {
				return nil, err
			}
			root.domainLine = p.key.Line
		case "descriptors":
			if root.descriptors, err = r.descriptors(p.value); err != nil {
				return nil, err
			}
		case "unit_multiplier":
			return nil, misplacedMultiplier(r.file, p.key.Line, "beside the domain")
		case "record_over_limit":
			return nil, misplacedRecord(r.file, p.key.Line, "beside the domain")
		}
	}
	return root, nil
}

func (r *yamlReader) descriptors(n *yaml.Node) ([]rawDescriptor, error) {
	n, err := r.deref(n)
	if err != nil {
		return nil, err
	}
	if isNull(n) {
		return nil, nil
	}
	if n.Kind != yaml.SequenceNode {
		return nil, r.typeErr(n, "a list of descriptors")
	}
	out := make([]rawDescriptor, 0, len(n.Content))
	for _, e := range n.Content {
		e, err := r.deref(e)
		if err != nil {
			return nil, err
		}
		d, err := r.descriptor(e)
		if err != nil {
			return nil, err
		}
		out = append(out, d)
	}
	return out, nil
}

func (r *yamlReader) descriptor(m *yaml.Node) (rawDescriptor, error) {
	d := rawDescriptor{line: m.Line}
	if m.Kind != yaml.MappingNode {
		return d, r.typeErr(m, "a descriptor")
	}
	ps, err := r.pairs(m)
	if err != nil {
		return d, err
	}
	for _, p := range ps {
		switch p.key.Value {
		case "key":
			d.key, err = r.str(p.value)
		case "value":
			d.value, err = r.str(p.value)
		case "rate_limit":
			d.rateLimit, err = r.rateLimit(p.value)
		case "descriptors":
			d.descriptors, err = r.descriptors(p.value)
		case "shadow_mode":
			d.shadowMode, err = r.boolean(p.value)
		case "quota_mode":
			d.quotaMode, err = r.boolean(p.value)
		case "record_over_limit":
			d.recordOverLimit, err = r.boolean(p.value)
			d.recordLine = p.key.Line
		case "detailed_metric":
			d.detailedMetric, err = r.boolean(p.value)
		case "value_to_metric":
			d.valueToMetric, err = r.boolean(p.value)
		case "share_threshold":
			d.shareThreshold, err = r.boolean(p.value)
		case "metadata":
			d.metadata, err = r.metadata(p.value)
		case "unit_multiplier":
			err = misplacedMultiplier(r.file, p.key.Line, "beside the descriptor's key")
		}
		if err != nil {
			return d, err
		}
	}
	return d, nil
}

func (r *yamlReader) rateLimit(n *yaml.Node) (*rawRateLimit, error) {
	n, err := r.deref(n)
	if err != nil {
		return nil, err
	}
	if isNull(n) {
		return nil, nil // "rate_limit:" with nothing after it is no rate limit, as in the reference
	}
	if n.Kind != yaml.MappingNode {
		return nil, r.typeErr(n, "a rate_limit")
	}
	ps, err := r.pairs(n)
	if err != nil {
		return nil, err
	}
	rl := &rawRateLimit{line: n.Line}
	for _, p := range ps {
		switch p.key.Value {
		case "requests_per_unit":
			rl.requestsPerUnit, err = r.uint32(p.value)
			rl.requestsLine = p.value.Line
		case "unit":
			rl.unit, err = r.str(p.value)
		case "unlimited":
			rl.unlimited, err = r.boolean(p.value)
		case "name":
			rl.name, err = r.str(p.value)
		case "replaces":
			rl.replaces, err = r.replaces(p.value)
		case "unit_multiplier":
			rl.multiplierSet, rl.multiplierLine = true, p.value.Line
			var ok bool
			rl.multiplier, rl.multiplierText, ok, err = r.multiplier(p.value)
			rl.badMultiplier = !ok
		case "record_over_limit":
			err = misplacedRecord(r.file, p.key.Line, "inside the rate_limit")
		}
		if err != nil {
			return nil, err
		}
	}
	return rl, nil
}

// misplacedMultiplier refuses a unit_multiplier outside a rate_limit.
func misplacedMultiplier(file string, line int, where string) *Error {
	return invalid(file, line, "unit_multiplier is %s: it belongs in the rule's rate_limit, beside its unit", where)
}

// misplacedRecord refuses a record_over_limit anywhere but beside a descriptor's key.
func misplacedRecord(file string, line int, where string) *Error {
	return invalid(file, line, "record_over_limit is %s: it belongs beside the descriptor's key, as shadow_mode does", where)
}

// multiplier reads a unit_multiplier: an integer of 0 or more (null is 0); one above the
// largest uint32 (the proto's) is read as that, which is longer than any window can be. It
// returns the value as written, for messages, and whether it is such an integer: anything
// else is for the rule to refuse with its name.
func (r *yamlReader) multiplier(n *yaml.Node) (value uint32, text string, ok bool, err error) {
	n, err = r.deref(n)
	if err != nil {
		return 0, "", false, err
	}
	switch {
	case isNull(n):
		return 0, "", true, nil
	case n.Kind != yaml.ScalarNode:
		return 0, show(n), false, nil
	case n.Style&(yaml.DoubleQuotedStyle|yaml.SingleQuotedStyle) != 0:
		return 0, "'" + n.Value + "'", false, nil
	case n.ShortTag() == "!!int":
		var i int64
		var u uint64
		switch {
		case n.Decode(&i) == nil && i >= 0:
			return uint32(min(i, math.MaxUint32)), n.Value, true, nil
		case n.Decode(&u) == nil:
			return math.MaxUint32, n.Value, true, nil
		}
	}
	return 0, n.Value, false, nil
}

// replaces reads the list of {name: ...}; a name left empty is kept, for the rules to refuse.
func (r *yamlReader) replaces(n *yaml.Node) ([]string, error) {
	n, err := r.deref(n)
	if err != nil {
		return nil, err
	}
	if isNull(n) {
		return nil, nil
	}
	if n.Kind != yaml.SequenceNode {
		return nil, r.typeErr(n, "a list of replaces")
	}
	var names []string
	for _, e := range n.Content {
		e, err := r.deref(e)
		if err != nil {
			return nil, err
		}
		if e.Kind != yaml.MappingNode {
			return nil, r.typeErr(e, "a replaces entry")
		}
		ps, err := r.pairs(e)
		if err != nil {
			return nil, err
		}
		name := ""
		for _, p := range ps {
			if p.key.Value == "name" {
				if name, err = r.str(p.value); err != nil {
					return nil, err
				}
			}
		}
		names = append(names, name)
	}
	return names, nil
}

// str is a scalar as written (an integer or a boolean given for a string is its text, as the
// reference reads it); null is "".
func (r *yamlReader) str(n *yaml.Node) (string, error) {
	n, err := r.deref(n)
	if err != nil {
		return "", err
	}
	switch {
	case isNull(n):
		return "", nil
	case n.Kind != yaml.ScalarNode:
		return "", r.typeErr(n, "string")
	}
	return n.Value, nil
}

// yaml11Bools are the plain words YAML 1.1, which the reference's parser follows, reads as
// booleans.
var yaml11Bools = map[string]bool{
	"y": true, "Y": true, "yes": true, "Yes": true, "YES": true, "on": true, "On": true, "ON": true,
	"n": false, "N": false, "no": false, "No": false, "NO": false, "off": false, "Off": false, "OFF": false,
}

// yaml11Bool reads a plain (unquoted, untagged) word of yaml11Bools as the boolean it is in
// YAML 1.1.
func yaml11Bool(n *yaml.Node) (value, ok bool) {
	if n.Style&(yaml.DoubleQuotedStyle|yaml.SingleQuotedStyle|yaml.LiteralStyle|yaml.FoldedStyle|yaml.TaggedStyle) != 0 {
		return false, false
	}
	value, ok = yaml11Bools[n.Value]
	return value, ok
}

func (r *yamlReader) boolean(n *yaml.Node) (bool, error) {
	n, err := r.deref(n)
	if err != nil {
		return false, err
	}
	if isNull(n) {
		return false, nil
	}
	if n.Kind == yaml.ScalarNode {
		switch n.ShortTag() {
		case "!!bool":
			var b bool
			if n.Decode(&b) == nil {
				return b, nil
			}
		case "!!str":
			if b, ok := yaml11Bool(n); ok {
				return b, nil
			}
		}
	}
	return false, r.typeErr(n, "bool")
}

func (r *yamlReader) uint32(n *yaml.Node) (uint32, error) {
	n, err := r.deref(n)
	if err != nil {
		return 0, err
	}
	if isNull(n) {
		return 0, nil
	}
	if n.Kind == yaml.ScalarNode && n.ShortTag() == "!!int" {
		var i int64
		if n.Decode(&i) == nil && i >= 0 && i <= math.MaxUint32 {
			return uint32(i), nil
		}
	}
	return 0, r.typeErr(n, "uint32")
}
