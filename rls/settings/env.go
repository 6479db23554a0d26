package settings

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"
)

// reader reads variables through a lookup function, collecting every error and warning so
// that an operator sees all of a deployment's problems at once, not one per restart.
type reader struct {
	lookup   func(string) (string, bool)
	errs     []error
	warnings []string
}

// get returns name's value and whether it is set. An empty value counts as set for strings
// (REDIS_URL="" means an empty address, as the reference reads it); the typed readers treat
// it as unset, where the reference would fail to parse it.
func (r *reader) get(name string) (string, bool) {
	return r.lookup(name)
}

// typed returns name's trimmed value and whether it is set to something.
func (r *reader) typed(name string) (string, bool) {
	v, ok := r.lookup(name)
	v = strings.TrimSpace(v)
	return v, ok && v != ""
}

// isSet reports whether name has a non-empty value.
func (r *reader) isSet(name string) bool {
	_, ok := r.typed(name)
	return ok
}

func (r *reader) invalid(format string, args ...any) {
	r.errs = append(r.errs, fmt.Errorf("%w: "+format, append([]any{ErrInvalid}, args...)...))
}

func (r *reader) refuse(format string, args ...any) {
	r.errs = append(r.errs, fmt.Errorf("%w: "+format, append([]any{ErrRefused}, args...)...))
}

func (r *reader) warn(format string, args ...any) {
	r.warnings = append(r.warnings, fmt.Sprintf(format, args...))
}

// str returns name's value, or def when it is not set.
func (r *reader) str(name, def string) string {
	if v, ok := r.get(name); ok {
		return v
	}
	return def
}

// boolean parses name as strconv.ParseBool does (1, t, true, 0, f, false, in any case).
func (r *reader) boolean(name string, def bool) bool {
	v, ok := r.typed(name)
	if !ok {
		return def
	}
	b, err := strconv.ParseBool(v)
	if err != nil {
		r.invalid("%s=%q is not a boolean (true or false)", name, v)
		return def
	}
	return b
}

// integer parses name as an int; like the reference, a 0x or 0o prefix selects the base.
func (r *reader) integer(name string, def int) int {
	v, ok := r.typed(name)
	if !ok {
		return def
	}
	n, err := strconv.ParseInt(v, 0, strconv.IntSize)
	if err != nil {
		r.invalid("%s=%q is not an integer", name, v)
		return def
	}
	return int(n)
}

// atLeast is integer for a value that must be min or more.
func (r *reader) atLeast(name string, def, min int) int {
	n := r.integer(name, def)
	if n < min {
		r.invalid("%s=%d is less than %d", name, n, min)
		return def
	}
	return n
}

// port is integer for a TCP port: 0 to 65535 (0 picks a free port).
func (r *reader) port(name string, def int) int {
	n := r.integer(name, def)
	if n < 0 || n > 65535 {
		r.invalid("%s=%d is not a port (0 to 65535)", name, n)
		return def
	}
	return n
}

// duration parses name as time.ParseDuration does ("100ms", "1m30s"), and refuses a negative
// one.
func (r *reader) duration(name string, def time.Duration) time.Duration {
	v, ok := r.typed(name)
	if !ok {
		return def
	}
	d, err := time.ParseDuration(v)
	if err != nil {
		r.invalid("%s=%q is not a duration (such as 500ms, 10s or 1h)", name, v)
		return def
	}
	if d < 0 {
		r.invalid("%s=%s is negative", name, v)
		return def
	}
	return d
}

// float parses name as a finite float64.
func (r *reader) float(name string, def float64) float64 {
	v, ok := r.typed(name)
	if !ok {
		return def
	}
	f, err := strconv.ParseFloat(v, 64)
	if err != nil || math.IsNaN(f) || math.IsInf(f, 0) {
		r.invalid("%s=%q is not a number", name, v)
		return def
	}
	return f
}

// word returns name's value folded to upper case, which must be one of allowed.
func (r *reader) word(name, def string, allowed ...string) string {
	v, ok := r.typed(name)
	if !ok {
		return def
	}
	up := strings.ToUpper(v)
	for _, a := range allowed {
		if up == a {
			return a
		}
	}
	r.invalid("%s=%q is not one of %s", name, v, strings.Join(allowed, ", "))
	return def
}

// stringMap parses name as the reference does a map: "key1:value1,key2:value2" (a value may
// hold ':'). An empty value is an empty map.
func (r *reader) stringMap(name string) map[string]string {
	m := map[string]string{}
	v, ok := r.typed(name)
	if !ok {
		return m
	}
	for _, pair := range strings.Split(v, ",") {
		key, value, found := strings.Cut(pair, ":")
		if !found || strings.TrimSpace(key) == "" {
			r.invalid("%s: %q is not key:value (the form is key1:value1,key2:value2)", name, pair)
			continue
		}
		m[strings.TrimSpace(key)] = value
	}
	return m
}

// list reads name as a comma-separated list, each item trimmed of spaces; an empty item
// (a trailing comma) is left out. Unset or empty, the list is nil.
func (r *reader) list(name string) []string {
	v, ok := r.typed(name)
	if !ok {
		return nil
	}
	var items []string
	for _, item := range strings.Split(v, ",") {
		if item = strings.TrimSpace(item); item != "" {
			items = append(items, item)
		}
	}
	return items
}

// location loads name as an IANA time zone ("UTC", "Europe/Paris").
func (r *reader) location(name, def string) *time.Location {
	v := def
	if got, ok := r.typed(name); ok {
		v = got
	}
	loc, err := time.LoadLocation(v)
	if err != nil {
		r.invalid("%s=%q is not a time zone (an IANA name such as UTC or Europe/Paris): %v", name, v, err)
		return time.UTC
	}
	return loc
}
