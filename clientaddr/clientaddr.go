// Package clientaddr tells the address of the client that sent a request, as a rate-limit
// key: the peer's address, or, when the peer is a trusted proxy, the first untrusted address
// of the forwarding header read right to left; an IPv6 client is keyed by its network prefix
// (/64 by default), since one subscriber holds a whole prefix and can rotate addresses inside
// it at will. httplimit and grpclimit both key by it, so one client gets the same key from
// either.
package clientaddr

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"
)

// Header selects which header a trusted proxy reports the client's address in.
type Header int

const (
	// XForwardedFor is the de facto X-Forwarded-For: a comma-separated list of addresses,
	// each proxy appending the address it received the request from. The default.
	XForwardedFor Header = iota
	// Forwarded is RFC 7239's Forwarded header; its for= parameters are read.
	Forwarded
)

// Name returns the header's field name as HTTP writes it: "X-Forwarded-For" or "Forwarded".
// gRPC metadata carries the same name in lower case.
func (h Header) Name() string {
	if h == Forwarded {
		return "Forwarded"
	}
	return "X-Forwarded-For"
}

// DefaultIPv6Prefix is the prefix length IPv6 clients are keyed by unless told otherwise: /64,
// one subscriber's link. Every IPv6 link is a /64 (SLAAC needs one), so a /64 is never shared
// by two subscribers, while the addresses inside it (2^64 of them, rotated by privacy
// extensions or at will) are all one client's. A subscriber delegated a /56 or a /48 can still
// use 256 or 65,536 keys; WithIPv6Prefix(56) or (48) closes that, at the price of counting
// together customers of a provider that hands each one /64 out of a shared /56 or /48.
const DefaultIPv6Prefix = 64

// Resolver tells a request's client key by its rules. Make one with New; it is safe for
// concurrent use.
type Resolver struct {
	trusted  []netip.Prefix
	header   Header
	ipv6Bits int
}

// Option configures New.
type Option func(*Resolver)

// WithTrustedProxies names the proxies (load balancers, CDNs) in front of the server. Only
// when the request comes from one of them is the forwarding header read: walking it right
// to left, every address inside prefixes is skipped and the first one outside is the
// client's. Without trusted proxies the header is ignored, as any client can write it.
func WithTrustedProxies(prefixes ...netip.Prefix) Option {
	return func(r *Resolver) {
		r.trusted = make([]netip.Prefix, len(prefixes))
		for i, p := range prefixes {
			r.trusted[i] = p.Masked()
		}
	}
}

// WithHeader selects the header the trusted proxies write: XForwardedFor (the default) or
// Forwarded. Only that one is read, since a client can send the other itself.
func WithHeader(h Header) Option { return func(r *Resolver) { r.header = h } }

// WithIPv6Prefix keys IPv6 clients by their /bits network prefix, written as a prefix
// ("2001:db8:1:2::/64"); 128 keys each address by itself, written as an address. The default
// is DefaultIPv6Prefix (64). IPv4 clients, IPv4-mapped IPv6 addresses ("::ffff:192.0.2.1")
// included, are always keyed by their address.
func WithIPv6Prefix(bits int) Option { return func(r *Resolver) { r.ipv6Bits = bits } }

// New returns a Resolver with opts. The error names an IPv6 prefix length outside 1 to 128 or
// an unknown header.
func New(opts ...Option) (*Resolver, error) {
	r := &Resolver{ipv6Bits: DefaultIPv6Prefix}
	for _, opt := range opts {
		opt(r)
	}
	if r.ipv6Bits < 1 || r.ipv6Bits > 128 {
		return nil, fmt.Errorf("clientaddr: IPv6 prefix /%d: want 1 to 128", r.ipv6Bits)
	}
	if r.header != XForwardedFor && r.header != Forwarded {
		return nil, fmt.Errorf("clientaddr: unknown forwarding header %d", int(r.header))
	}
	return r, nil
}

// Header returns the forwarding header Key reads, for the caller to pass its lines.
func (r *Resolver) Header() Header { return r.header }

// Key returns the key of the client that sent a request from peer ("host:port", as net/http's
// RemoteAddr and gRPC's peer address are written, or a bare address), whose lines of the
// Header() header are lines (read only when peer is a trusted proxy).
//
// It is peer's address, or, when peer is a trusted proxy, the first untrusted address of the
// forwarding header read right to left. Every hop to the right of that one was written by a
// trusted proxy, so a client can only prepend addresses, which are never read. A hop a trusted
// proxy wrote that is no address (RFC 7239's "unknown" or an obfuscated identifier) is the key
// as it is; when every hop is trusted, the leftmost is the client. An IPv6 address is then
// keyed by its prefix (WithIPv6Prefix).
func (r *Resolver) Key(peer string, lines []string) (string, error) {
	addr, err := parseHostPort(peer)
	if err != nil {
		return "", fmt.Errorf("peer address %q: %w", peer, err)
	}
	if !isTrusted(addr, r.trusted) {
		return r.addrKey(addr), nil
	}
	var hops []string
	if r.header == Forwarded {
		hops = forwardedFor(lines)
	} else {
		hops = xForwardedFor(lines)
	}
	client := addr
	for i := len(hops) - 1; i >= 0; i-- {
		hop, ok := parseHop(hops[i])
		if !ok {
			if hops[i] == "" {
				break // an empty hop says nothing: the last trusted proxy is the client
			}
			return hops[i], nil
		}
		client = hop
		if !isTrusted(hop, r.trusted) {
			break
		}
	}
	return r.addrKey(client), nil
}

// addrKey writes a client's address as its key: IPv4 as it is, IPv6 as its prefix.
func (r *Resolver) addrKey(a netip.Addr) string {
	if a.Is4() || r.ipv6Bits == 128 {
		return a.String()
	}
	p, err := a.Prefix(r.ipv6Bits)
	if err != nil { // not reached: a is a valid IPv6 address and the length was checked
		return a.String()
	}
	return p.String()
}

func isTrusted(a netip.Addr, trusted []netip.Prefix) bool {
	for _, p := range trusted {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// parseHostPort reads a peer's address: "host:port" as net/http's RemoteAddr and gRPC's peer
// address write it, or a bare address.
func parseHostPort(s string) (netip.Addr, error) {
	host, _, err := net.SplitHostPort(s)
	if err != nil {
		host = s
	}
	a, err := netip.ParseAddr(host)
	if err != nil {
		return netip.Addr{}, errors.New("not an IP address")
	}
	return a.WithZone("").Unmap(), nil
}

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

// xForwardedFor splits X-Forwarded-For lines into hops, left to right.
func xForwardedFor(lines []string) []string {
	var hops []string
	for _, line := range lines {
		for _, h := range strings.Split(line, ",") {
			hops = append(hops, strings.TrimSpace(h))
		}
	}
	return hops
}

// forwardedFor returns the for= value of each element of RFC 7239 Forwarded lines, left to
// right, unquoted; "" for an element without one. Commas and semicolons inside quoted
// strings do not split.
func forwardedFor(lines []string) []string {
	var hops []string
	for _, line := range lines {
		for _, elem := range splitQuoted(line, ',') {
			hop := ""
			for _, pair := range splitQuoted(elem, ';') {
				name, value, ok := strings.Cut(strings.TrimSpace(pair), "=")
				if ok && strings.EqualFold(strings.TrimSpace(name), "for") {
					hop = unquote(strings.TrimSpace(value))
				}
			}
			hops = append(hops, hop)
		}
	}
	return hops
}

// splitQuoted splits s at sep outside double-quoted strings.
func splitQuoted(s string, sep byte) []string {
	var parts []string
	quoted, escaped, start := false, false, 0
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case escaped:
			escaped = false
		case quoted && c == '\\':
			escaped = true
		case c == '"':
			quoted = !quoted
		case !quoted && c == sep:
			parts = append(parts, s[start:i])
			start = i + 1
		}
	}
	return append(parts, s[start:])
}

// unquote removes the quotes and backslash escapes of an RFC 7230 quoted-string.
func unquote(s string) string {
	if len(s) < 2 || s[0] != '"' || s[len(s)-1] != '"' {
		return s
	}
	var b strings.Builder
	for i := 1; i < len(s)-1; i++ {
		if s[i] == '\\' && i+1 < len(s)-1 {
			i++
		}
		b.WriteByte(s[i])
	}
	return b.String()
}
