package clientaddr

import (
	"errors"
	"net/netip"
	"strings"
	"testing"
)

// IPv6 clients are keyed by their prefix, /64 unless told otherwise; IPv4 and IPv4-mapped
// clients by their address; the prefix applies to the client a trusted proxy names too.
func TestKeyIPv6Prefix(t *testing.T) {
	trusted := WithTrustedProxies(netip.MustParsePrefix("10.0.0.0/8"))
	for _, tc := range []struct {
		opts  []Option
		peer  string
		lines []string
		want  string
	}{
		{nil, "[2001:db8:1:2:aaaa::1]:443", nil, "2001:db8:1:2::/64"},
		{nil, "[2001:db8:1:2:bbbb::9]:443", nil, "2001:db8:1:2::/64"},
		{nil, "[2001:db8:1:3::1]:443", nil, "2001:db8:1:3::/64"},
		{nil, "[fe80::1%eth0]:443", nil, "fe80::/64"},
		{nil, "192.0.2.1:443", nil, "192.0.2.1"},
		{nil, "[::ffff:192.0.2.1]:443", nil, "192.0.2.1"},
		{[]Option{WithIPv6Prefix(48)}, "[2001:db8:1:3::1]:443", nil, "2001:db8:1::/48"},
		{[]Option{WithIPv6Prefix(128)}, "[2001:db8:1:3::1]:443", nil, "2001:db8:1:3::1"},
		{[]Option{trusted}, "10.0.0.1:1", []string{"2001:db8:7:7:1::5"}, "2001:db8:7:7::/64"},
		{[]Option{trusted}, "10.0.0.1:1", []string{"::ffff:198.51.100.4, 10.0.0.2"}, "198.51.100.4"},
	} {
		r, err := New(tc.opts...)
		if err != nil {
			t.Fatal(err)
		}
		got, err := r.Key(tc.peer, tc.lines)
		if err != nil || got != tc.want {
			t.Errorf("Key(%q, %q) = %q, %v; want %q", tc.peer, tc.lines, got, err, tc.want)
		}
	}
	for _, bits := range []int{0, -1, 129} {
		if _, err := New(WithIPv6Prefix(bits)); err == nil {
			t.Errorf("WithIPv6Prefix(%d) accepted", bits)
		}
	}
	if _, err := New(WithHeader(Header(7))); err == nil {
		t.Error("an unknown header accepted")
	}
	r, _ := New()
	if _, err := r.Key("not-an-address", nil); err == nil {
		t.Error("an unparsable peer gave a key")
	}
}

// A peer on a Unix socket ("@", "" or a path, as Go writes it) has no IP address: without
// WithTrustedUnixSocket it is an error wrapping ErrUnixSocket that names the option; with it
// the peer is a trusted proxy, its forwarding header is read, and without one the key is
// UnixSocketKey. Other peers are unchanged.
func TestUnixSocketPeer(t *testing.T) {
	unixPeers := []string{"@", "", "@abstract", "/run/client.sock"}
	for _, h := range []Header{XForwardedFor, Forwarded} {
		plain := mustNew(t, proxies, WithHeader(h))
		for _, peer := range unixPeers {
			_, err := plain.Key(peer, []string{"203.0.113.9"})
			if !errors.Is(err, ErrUnixSocket) || !strings.Contains(err.Error(), "WithTrustedUnixSocket") {
				t.Errorf("%s: Key(%q) without WithTrustedUnixSocket: %v; want ErrUnixSocket naming the option", h.Name(), peer, err)
			}
		}
	}
	for _, peer := range []string{"not-an-address", "relative.sock", "pipe"} {
		for _, r := range []*Resolver{mustNew(t), mustNew(t, WithTrustedUnixSocket())} {
			if got, err := r.Key(peer, nil); err == nil || errors.Is(err, ErrUnixSocket) {
				t.Errorf("Key(%q) = %q, %v; want an error that is not ErrUnixSocket", peer, got, err)
			}
		}
	}

	xff := mustNew(t, WithTrustedUnixSocket(), proxies, WithIPv6Prefix(128))
	fwd := mustNew(t, WithTrustedUnixSocket(), WithHeader(Forwarded))
	for _, tc := range []struct {
		r     *Resolver
		peer  string
		lines []string
		want  string
	}{
		{xff, "@", []string{"203.0.113.9"}, "203.0.113.9"},
		{xff, "", []string{"198.51.100.1, 203.0.113.10, 10.0.0.2"}, "203.0.113.10"},
		{xff, "/run/client.sock", []string{"2001:db8::5"}, "2001:db8::5"},
		{xff, "@abstract", nil, UnixSocketKey},
		{xff, "@", []string{""}, UnixSocketKey},
		{xff, "@", []string{"10.0.0.3, 10.0.0.2"}, "10.0.0.3"},
		{xff, "192.0.2.1:5", []string{"203.0.113.9"}, "192.0.2.1"}, // an IP peer: as before
		{xff, "10.0.0.1:5", []string{"203.0.113.9"}, "203.0.113.9"},
		{fwd, "@", []string{`for="1, for="[2001:db8:1:2::9]:443"`}, "2001:db8:1:2::/64"},
		{fwd, "@", nil, UnixSocketKey},
	} {
		got, err := tc.r.Key(tc.peer, tc.lines)
		if err != nil || got != tc.want {
			t.Errorf("%s: Key(%q, %q) = %q, %v; want %q", tc.r.Header().Name(), tc.peer, tc.lines, got, err, tc.want)
		}
	}
	if _, err := fwd.Key("@", []string{`for="1`}); !errors.Is(err, ErrMalformedHeader) {
		t.Errorf("a malformed Forwarded header from a Unix-socket proxy: %v, want ErrMalformedHeader", err)
	}
}
