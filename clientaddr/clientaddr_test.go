package clientaddr

import (
	"net/netip"
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
