package clientaddr

import (
	"errors"
	"net/netip"
	"runtime"
	"strings"
	"testing"
)

// proxies are the trusted proxies of the tests below: 10.0.0.0/8.
var proxies = WithTrustedProxies(netip.MustParsePrefix("10.0.0.0/8"))

// mustNew is New, failing tb on an error.
func mustNew(tb testing.TB, opts ...Option) *Resolver {
	tb.Helper()
	r, err := New(opts...)
	if err != nil {
		tb.Fatal(err)
	}
	return r
}

// A client writes the left part of the Forwarded header, and a trusted proxy may append its
// element to the client's own field line (RFC 7239 section 4). Whatever the client writes
// (an open quoted-string, a stray quote or backslash, a quoted comma), the elements the
// proxies appended on its right are read as the proxies wrote them.
func TestForwardedClientCannotReachProxyElements(t *testing.T) {
	r := mustNew(t, proxies, WithHeader(Forwarded), WithIPv6Prefix(128))
	for _, tc := range []struct {
		lines []string
		want  string
	}{
		// An open quote would swallow the proxy's element: a new key for every request.
		{[]string{`for="1, for=203.0.113.9`}, "203.0.113.9"},
		// A quote opened in a parameter would make the client's for= the key: another
		// client's quota.
		{[]string{`for=198.51.100.77;x=", for=203.0.113.10`}, "203.0.113.10"},
		{[]string{`for=198.51.100.77;x=", for=203.0.113.10, for=10.0.0.2`}, "203.0.113.10"},
		// An escaped quote that leaves the client's string open.
		{[]string{`for="198.51.100.1\", for=203.0.113.11`}, "203.0.113.11"},
		// An open quote before a proxy element that is itself quoted.
		{[]string{`for="x, for="[2001:db8::1]:4711"`}, "2001:db8::1"},
		{[]string{`for="x, For="[2001:db8::2]";proto=https;by=10.0.0.9, for=10.0.0.3`}, "2001:db8::2"},
		// Stray syntax the client wrote.
		{[]string{`"""", for=203.0.113.12`}, "203.0.113.12"},
		{[]string{`\, for=203.0.113.13`}, "203.0.113.13"},
		{[]string{`for=1;;=;"a\\"b, for=203.0.113.14`}, "203.0.113.14"},
		// A well-formed quoted comma in the client's element.
		{[]string{`for="198.51.100.1, for=10.0.0.9", for=203.0.113.15`}, "203.0.113.15"},
		// The client's open quote on a line of its own.
		{[]string{`for="1`, `for=203.0.113.16`}, "203.0.113.16"},
	} {
		got, err := r.Key("10.0.0.1:1", tc.lines)
		if err != nil || got != tc.want {
			t.Errorf("Key(%q) = %q, %v; want %q", tc.lines, got, err, tc.want)
		}
	}
}

// Well-formed Forwarded headers are read as RFC 7239 writes them: quoted or bare values, any
// parameter order, "for" in any case, several lines, optional whitespace, escapes in quoted
// strings; a trusted proxy's "unknown" or obfuscated identifier is the key; an element without
// for= ends the walk at the last trusted proxy.
func TestForwardedWellFormed(t *testing.T) {
	r := mustNew(t, proxies, WithHeader(Forwarded), WithIPv6Prefix(128))
	for _, tc := range []struct {
		lines []string
		want  string
	}{
		{nil, "10.0.0.1"},
		{[]string{`for=203.0.113.9`}, "203.0.113.9"},
		{[]string{`for=192.0.2.60;proto=http;by=203.0.113.43`}, "192.0.2.60"},
		{[]string{`proto=http ; FOR = 192.0.2.61 ;by=10.0.0.7`}, "192.0.2.61"},
		{[]string{`for="192.0.2.62:8080"`}, "192.0.2.62"},
		{[]string{`for=192.0.2.63:8080`}, "192.0.2.63"},
		{[]string{`for="[2001:db8:cafe::17]:4711"`}, "2001:db8:cafe::17"},
		{[]string{`for=[2001:db8:cafe::18]`}, "2001:db8:cafe::18"},
		{[]string{`for=192.0.2.43, for=198.51.100.17`}, "198.51.100.17"},
		{[]string{`for=192.0.2.43`, `for=10.0.0.8,for=10.0.0.9`}, "192.0.2.43"},
		{[]string{"for=192.0.2.44\t,\tfor=10.0.0.8 "}, "192.0.2.44"},
		{[]string{`for=unknown`}, "unknown"},
		{[]string{`for="_hidden", for=10.0.0.8`}, "_hidden"},
		{[]string{`for="_a\"b\\c"`}, `_a"b\c`},
		{[]string{`for=10.0.0.9, for=10.0.0.8`}, "10.0.0.9"},     // every hop trusted: the leftmost
		{[]string{`for=192.0.2.45, proto=https`}, "10.0.0.1"},    // no for=: the last trusted proxy
		{[]string{`for=192.0.2.45, , for=10.0.0.8`}, "10.0.0.8"}, // an empty element likewise
		{[]string{`for=192.0.2.45, for=""`}, "10.0.0.1"},         // and an empty for=
		{[]string{`for=192.0.2.46;x="a,b;c=d", for=10.0.0.8`}, "192.0.2.46"},
	} {
		got, err := r.Key("10.0.0.1:1", tc.lines)
		if err != nil || got != tc.want {
			t.Errorf("Key(%q) = %q, %v; want %q", tc.lines, got, err, tc.want)
		}
	}
}

// An element Key has to read (every element on its right is a trusted proxy's) that breaks
// RFC 7239's syntax is an error wrapping ErrMalformedHeader, never a key: neither its text as
// the key nor the proxy's address, which all the proxy's clients share.
func TestForwardedMalformedIsAnError(t *testing.T) {
	r := mustNew(t, proxies, WithHeader(Forwarded))
	for _, lines := range [][]string{
		{`for="10.0.0.7`},
		{`for="198.51.100.1, for=10.0.0.7`}, // open quote: the element left of the proxy's
		{`for=198.51.100.1"`},
		{`for="198.51.100.1\"`},
		{`for=198.51.100.1"x"`},
		{`for=a"b"c`},
		{`for=`},
		{`for`},
		{`=198.51.100.1`},
		{`for==198.51.100.1`},
		{`for=198.51.100.1 for=198.51.100.2`},
		{`for=198.51.100.1;for=198.51.100.2`},
		{`for=198.51.100.1\`},
		{"for=\"198.51.100.1\x01\""},
		{"for=198.51.100.1\x00"},
		{`f(r=198.51.100.1`},
		{`for=198.51.100.1, for=10.0.0.7`, `proto=https;for="x`},
	} {
		got, err := r.Key("10.0.0.1:1", lines)
		if !errors.Is(err, ErrMalformedHeader) {
			t.Errorf("Key(%q) = %q, %v; want ErrMalformedHeader", lines, got, err)
		}
	}
}

// X-Forwarded-For has no quoting: whatever a client writes in it, the hops the proxies
// appended are read as written.
func TestXForwardedForHostile(t *testing.T) {
	r := mustNew(t, proxies, WithIPv6Prefix(128))
	for _, tc := range []struct {
		lines []string
		want  string
	}{
		{[]string{`"1, 203.0.113.9`}, "203.0.113.9"},
		{[]string{`198.51.100.77;x=", 203.0.113.10`}, "203.0.113.10"},
		{[]string{`for="1, for=203.0.113.9, 203.0.113.11`}, "203.0.113.11"},
		{[]string{"\x00\xff,,,;\\\", \t203.0.113.12\t, 10.0.0.2"}, "203.0.113.12"},
		{[]string{`10.0.0.5, 10.0.0.6`, `,10.0.0.2`}, "10.0.0.2"}, // an empty hop: the last trusted proxy
		{[]string{`198.51.100.1`, ``}, "10.0.0.1"},
		{[]string{strings.Repeat("198.51.100.1, ", 1000) + "[2001:db8::5]:443, 10.0.0.3:80"}, "2001:db8::5"},
	} {
		got, err := r.Key("10.0.0.1:1", tc.lines)
		if err != nil || got != tc.want {
			t.Errorf("Key(%q) = %q, %v; want %q", tc.lines, got, err, tc.want)
		}
	}
}

// bytesPerCall is the heap memory one call of f allocates, on average.
func bytesPerCall(f func()) uint64 {
	const runs = 8
	f()
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	for range runs {
		f()
	}
	runtime.ReadMemStats(&after)
	return (after.TotalAlloc - before.TotalAlloc) / runs
}

// hugeHeaders are 1 MiB forwarding headers whose last hop is an untrusted client: what a
// trusted proxy forwards after a client filled the header.
func hugeHeaders() map[Header][]string {
	const size = 1 << 20
	return map[Header][]string{
		XForwardedFor: {strings.Repeat("198.51.100.1, ", size/14) + "203.0.113.9"},
		Forwarded:     {strings.Repeat(`for=198.51.100.1;proto=https;x="a,b", `, size/38) + "for=203.0.113.9"},
	}
}

// Key reads a forwarding header from the right and only as far as it needs: a 1 MiB header
// whose last hop is untrusted costs what a short one does.
func TestKeyMemoryBounded(t *testing.T) {
	const most = 64 << 10
	for h, lines := range hugeHeaders() {
		r := mustNew(t, proxies, WithHeader(h))
		var err error
		n := bytesPerCall(func() { _, err = r.Key("10.0.0.1:1", lines) })
		if err != nil {
			t.Fatalf("%s: %v", h.Name(), err)
		}
		if n > most {
			t.Errorf("%s of %d bytes: Key allocates %d bytes, want at most %d", h.Name(), len(lines[0]), n, most)
		}
	}
}

// BenchmarkKey is Key behind one trusted proxy, for a short header and for a 1 MiB one whose
// last hop is the client.
func BenchmarkKey(b *testing.B) {
	huge := hugeHeaders()
	for _, bc := range []struct {
		name   string
		header Header
		lines  []string
	}{
		{"XForwardedFor/short", XForwardedFor, []string{"198.51.100.1, 203.0.113.9"}},
		{"XForwardedFor/1MiB", XForwardedFor, huge[XForwardedFor]},
		{"Forwarded/short", Forwarded, []string{`for=198.51.100.1;proto=https, for="[2001:db8::1]:443"`}},
		{"Forwarded/1MiB", Forwarded, huge[Forwarded]},
	} {
		b.Run(bc.name, func(b *testing.B) {
			r := mustNew(b, proxies, WithHeader(bc.header))
			b.ReportAllocs()
			for b.Loop() {
				if _, err := r.Key("10.0.0.1:1", bc.lines); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// FuzzClientPrefix puts anything a client can write in front of what trusted proxies append,
// on the same line and on a line of its own: the key must be the proxies' client, for both
// headers. Run it longer with go test -run='^$' -fuzz=FuzzClientPrefix ./clientaddr.
func FuzzClientPrefix(f *testing.F) {
	for _, seed := range []string{``, `for="1`, `for=198.51.100.77;x="`, `"`, `\`, `for="a\"`, `,`, `;`, `=`,
		`for="x, for=10.0.0.3"`, `for=10.0.0.3`, "\x00\r\n\xff"} {
		f.Add(seed)
	}
	fwd := mustNew(f, proxies, WithHeader(Forwarded), WithIPv6Prefix(128))
	xff := mustNew(f, proxies, WithIPv6Prefix(128))
	f.Fuzz(func(t *testing.T, client string) {
		for _, tc := range []struct {
			r     *Resolver
			lines []string
			want  string
		}{
			{fwd, []string{client + ", for=203.0.113.9"}, "203.0.113.9"},
			{fwd, []string{client + `,for="[2001:db8::9]:443";proto=https, for=10.0.0.2`}, "2001:db8::9"},
			{fwd, []string{client, "for=203.0.113.9"}, "203.0.113.9"},
			{xff, []string{client + ", 203.0.113.9"}, "203.0.113.9"},
			{xff, []string{client, "2001:db8::9, 10.0.0.2"}, "2001:db8::9"},
		} {
			got, err := tc.r.Key("10.0.0.1:1", tc.lines)
			if err != nil || got != tc.want {
				t.Errorf("%s %q: %q, %v; want %q", tc.r.Header().Name(), tc.lines, got, err, tc.want)
			}
		}
	})
}

// forwardedLeftToRight is a reference for cutLastElement: it parses a whole Forwarded line
// from the left, as RFC 7239 is written, with the same leniencies, and returns each element's
// for= value ("" for none), or false if the line breaks the syntax anywhere.
func forwardedLeftToRight(line string) ([]string, bool) {
	skip := func(i int) int {
		for i < len(line) && (line[i] == ' ' || line[i] == '\t') {
			i++
		}
		return i
	}
	var fors []string
	forValue, seenFor := "", false
	for i := 0; ; {
		i = skip(i)
		if i < len(line) && line[i] != ',' && line[i] != ';' {
			j := i
			for j < len(line) && isTchar(line[j]) {
				j++
			}
			name := line[i:j]
			if j = skip(j); name == "" || j == len(line) || line[j] != '=' {
				return nil, false
			}
			i = skip(j + 1)
			var value string
			if i < len(line) && line[i] == '"' {
				k := i + 1
				for ; k < len(line) && line[k] != '"'; k++ {
					if line[k] == '\\' {
						k++
					}
					if k == len(line) || !isQuotedPairByte(line[k]) {
						return nil, false
					}
				}
				if k == len(line) {
					return nil, false
				}
				value, i = unquote(line[i+1:k]), k+1
			} else {
				j := i
				for j < len(line) && isValueByte(line[j]) {
					j++
				}
				if j == i {
					return nil, false
				}
				value, i = line[i:j], j
			}
			if strings.EqualFold(name, "for") {
				if seenFor {
					return nil, false
				}
				forValue, seenFor = value, true
			}
			i = skip(i)
		}
		switch {
		case i == len(line):
			return append(fors, forValue), true
		case line[i] == ';':
			i++
		case line[i] == ',':
			fors = append(fors, forValue)
			forValue, seenFor = "", false
			i++
		default:
			return nil, false
		}
	}
}

// FuzzForwardedBothWays checks the right-to-left reader against the left-to-right reference:
// a line one of them reads whole, the other reads whole too, to the same for= values. So the
// walk from the right reads exactly RFC 7239's elements, and a syntax error anywhere stops it.
// Run it longer with go test -run='^$' -fuzz=FuzzForwardedBothWays ./clientaddr.
func FuzzForwardedBothWays(f *testing.F) {
	for _, seed := range []string{``, `for=1`, `for="1`, `for=192.0.2.60;proto=http;by=203.0.113.43`,
		`for="[2001:db8::1]:4711", for=unknown`, `x="a\"b\\", for="_c"`, `;;,;, ,`, `for=a;for=b`, `for=a for=b`,
		`for="\\"\\"`, `a="\"`, `for = "x" ; y=z`, "for=\"\x80\t\"", `=`, `a=b"c"`} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, line string) {
		want, wantOK := forwardedLeftToRight(line)
		var got []string
		w := hopWalker{header: Forwarded, lines: []string{line}}
		for {
			hop, ok, err := w.next()
			if err != nil {
				if wantOK {
					t.Fatalf("%q: right to left: %v; left to right: %q", line, err, want)
				}
				return
			}
			if !ok {
				break
			}
			got = append([]string{hop}, got...)
		}
		if !wantOK || strings.Join(got, "\x00") != strings.Join(want, "\x00") || len(got) != len(want) {
			t.Fatalf("%q: right to left %q; left to right %q, %v", line, got, want, wantOK)
		}
	})
}
