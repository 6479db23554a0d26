package clientaddr

import (
	"fmt"
	"net/netip"
	"strings"
)

// This file reads forwarding headers from the right, hop by hop, as Key needs them: the
// proxies that are trusted appended the rightmost hops, and whatever the client wrote lies on
// their left. Nothing on the left of a hop can change how that hop is read, and nothing is read
// past the hop Key stops at, so a header costs time for the hops read and no memory for its
// length.

// hopWalker yields the hops of a forwarding header's field lines from the right: the last line
// first, each one from its end.
type hopWalker struct {
	header Header
	lines  []string // the lines not begun
	line   string   // the unread left part of the line being read
	inLine bool     // line still holds a hop (possibly an empty one)
}

// next returns the next hop leftwards, as written (a Forwarded for= value unquoted); ok is
// false when none is left. A hop that names no one (an empty X-Forwarded-For entry, a Forwarded
// element without for=) is "". The error, for a Forwarded element that breaks RFC 7239's
// syntax, wraps ErrMalformedHeader; the walk cannot go on past it.
func (w *hopWalker) next() (hop string, ok bool, err error) {
	for !w.inLine {
		if len(w.lines) == 0 {
			return "", false, nil
		}
		last := len(w.lines) - 1
		w.line, w.lines, w.inLine = w.lines[last], w.lines[:last], true
	}
	var before string
	var more bool
	if w.header == Forwarded {
		before, more, hop, err = cutLastElement(w.line)
		if err != nil {
			return "", false, err
		}
	} else {
		before, more, hop = cutLastXFF(w.line)
	}
	w.line, w.inLine = before, more
	return hop, true, nil
}

// cutLastXFF splits an X-Forwarded-For line at its last comma: the text before it (more is
// false when there is no comma) and the hop after it, without surrounding whitespace. The
// header has no quoting, so a comma always separates two hops.
func cutLastXFF(line string) (before string, more bool, hop string) {
	i := strings.LastIndexByte(line, ',')
	if i < 0 {
		return "", false, strings.TrimSpace(line)
	}
	return line[:i], true, strings.TrimSpace(line[i+1:])
}

// cutLastElement reads the last element of an RFC 7239 Forwarded line from its end leftwards,
// pair by pair, and returns the text before the comma that opens it (more is false when it
// opens the line) and its for= value, unquoted ("" when it has none).
//
// Read from the right, a well-formed element parses as it does from the left: a quoted-string
// ends at its last '"' and opens at the first '"' on its left that an even number of
// backslashes precedes (an odd number escapes it), and a token holds none of the delimiters.
// So the elements a proxy appended are found whatever the client wrote on their left, even a
// quote it never closed. An element that breaks the syntax (a quote with no partner, a stray
// character, for= twice) is an error wrapping ErrMalformedHeader: where it starts cannot be
// told, so neither it nor anything on its left can be read.
//
// Leniencies, all safe read from either side: optional whitespace around ';', ',' and '=',
// empty elements and pairs (the #rule and RFC 7239's grammar allow them), and ':', '[' and
// ']' in a bare value, for proxies that forget to quote an IPv6 address or a port.
func cutLastElement(line string) (before string, more bool, forValue string, err error) {
	end := len(line) // the element's end, for error messages
	seenFor := false
	i := len(line)
	for {
		i = skipOWSLeft(line, i)
		if i == 0 {
			return "", false, forValue, nil
		}
		switch line[i-1] {
		case ',':
			return line[:i-1], true, forValue, nil
		case ';': // an empty pair
			i--
			continue
		}
		// A pair, name=value, read from its end.
		valueEnd := i
		quoted := line[i-1] == '"'
		if quoted {
			open, ok := openingQuote(line, i-1)
			if !ok {
				return "", false, "", malformed(line, i-1, end, "a quoted-string that never opens")
			}
			if !validQuoted(line[open+1 : i-1]) {
				return "", false, "", malformed(line, open, end, "a quoted-string with a bad character or escape")
			}
			i = open
		} else {
			for i > 0 && isValueByte(line[i-1]) {
				i--
			}
			if i == valueEnd {
				return "", false, "", malformed(line, i-1, end, "no value, or a character no value holds")
			}
		}
		value := line[i:valueEnd]
		i = skipOWSLeft(line, i)
		if i > 0 && line[i-1] == '"' {
			return "", false, "", malformed(line, i-1, end, "a quote that never closes")
		}
		if i == 0 || line[i-1] != '=' {
			return "", false, "", malformed(line, i-1, end, "a value without name=")
		}
		nameEnd := skipOWSLeft(line, i-1)
		i = nameEnd
		for i > 0 && isTchar(line[i-1]) {
			i--
		}
		if i == nameEnd {
			return "", false, "", malformed(line, i-1, end, "no parameter name")
		}
		if strings.EqualFold(line[i:nameEnd], "for") {
			if seenFor {
				return "", false, "", malformed(line, i, end, "for= twice in one element")
			}
			seenFor, forValue = true, value
			if quoted {
				forValue = unquote(value[1 : len(value)-1])
			}
		}
		i = skipOWSLeft(line, i)
		switch {
		case i == 0 || line[i-1] == ',':
			// The element ends; the loop's head says how.
		case line[i-1] == ';':
			i--
		default:
			return "", false, "", malformed(line, i-1, end, "two pairs without ';' between them")
		}
	}
}

// openingQuote returns the index of the '"' that opens the quoted-string whose closing '"' is
// at line[closing]: the nearest one on its left that an even number of backslashes precedes.
// Each backslash is counted once, so the search costs the string's length.
func openingQuote(line string, closing int) (int, bool) {
	for j := closing - 1; j >= 0; j-- {
		if line[j] != '"' {
			continue
		}
		run := 0
		for j-run-1 >= 0 && line[j-run-1] == '\\' {
			run++
		}
		if run%2 == 0 {
			return j, true
		}
		j -= run // an escaped quote: go on left of its backslashes
	}
	return 0, false
}

// validQuoted reports whether s, the inside of a quoted-string, is RFC 9110's: qdtext and
// quoted-pairs only, with no unescaped '"' and no backslash left without its character.
func validQuoted(s string) bool {
	for k := 0; k < len(s); k++ {
		c := s[k]
		switch {
		case c == '\\':
			if k+1 == len(s) || !isQuotedPairByte(s[k+1]) {
				return false
			}
			k++
		case c == '"' || !isQuotedPairByte(c):
			return false
		}
	}
	return true
}

// unquote removes the backslash escapes of the inside of a valid quoted-string. It allocates
// only when there are escapes.
func unquote(s string) string {
	if strings.IndexByte(s, '\\') < 0 {
		return s
	}
	var b strings.Builder
	b.Grow(len(s))
	for k := 0; k < len(s); k++ {
		if s[k] == '\\' {
			k++
		}
		b.WriteByte(s[k])
	}
	return b.String()
}

// malformed is the error for a Forwarded element that breaks the syntax at line[at], showing
// the text around it up to the element's end.
func malformed(line string, at, end int, what string) error {
	at = max(at, 0)
	lo, hi := max(at-16, 0), min(at+48, end)
	return fmt.Errorf("%w: Forwarded: %s, near %q", ErrMalformedHeader, what, line[lo:hi])
}

// skipOWSLeft returns i moved left past spaces and tabs.
func skipOWSLeft(line string, i int) int {
	for i > 0 && (line[i-1] == ' ' || line[i-1] == '\t') {
		i--
	}
	return i
}

// isTchar reports whether c may appear in an RFC 9110 token.
func isTchar(c byte) bool {
	switch {
	case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		return true
	}
	return strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0
}

// isValueByte reports whether c may appear in a bare (unquoted) Forwarded value: a token's
// characters, and ':', '[' and ']', which proxies write in unquoted addresses. None of them is
// a delimiter, a quote or a backslash, so a bare value reads the same from either side.
func isValueByte(c byte) bool { return isTchar(c) || c == ':' || c == '[' || c == ']' }

// isQuotedPairByte reports whether c may follow a backslash in a quoted-string: HTAB, SP,
// VCHAR or obs-text. Less '"' and '\', these are also qdtext.
func isQuotedPairByte(c byte) bool { return c == '\t' || (c >= ' ' && c != 0x7f) }

// parseHop reads one forwarding hop: an address, "address:port", "[v6]" or "[v6]:port".
func parseHop(s string) (netip.Addr, bool) {
	if a, err := netip.ParseAddr(s); err == nil {
		return a.WithZone("").Unmap(), true
	}
	if ap, err := netip.ParseAddrPort(s); err == nil {
		return ap.Addr().WithZone("").Unmap(), true
	}
	if len(s) > 2 && s[0] == '[' && s[len(s)-1] == ']' {
		if a, err := netip.ParseAddr(s[1 : len(s)-1]); err == nil {
			return a.WithZone("").Unmap(), true
		}
	}
	return netip.Addr{}, false
}
