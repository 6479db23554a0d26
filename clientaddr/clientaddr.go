// Package clientaddr tells the address of the client that sent a request, as a rate-limit
// key: the peer's address, or, when the peer is a trusted proxy, the first untrusted address
// of the forwarding header read right to left; an IPv6 client is keyed by its network prefix
// (/64 by default), since one subscriber holds a whole prefix and can rotate addresses inside
// it at will. httplimit and grpclimit both key by it, so one client gets the same key from
// either.
//
// # Reading forwarding headers
//
// Each proxy appends the address it received the request from at the right of the header,
// on the last field line or on a line of its own, so the hops the trusted proxies wrote are
// the rightmost ones and the client's own text lies on their left. Key walks the header from
// the right end, hop by hop, and stops at the first hop that is not a trusted proxy: it never
// reads further, and nothing on the left of a hop changes how that hop is read. This matters
// for RFC 7239's Forwarded header, whose quoted-strings may hold commas: read from the left,
// a quote the client opens and never closes would swallow the elements a proxy appended to
// its line, and the client would choose its own key. Read from the right, the proxies'
// elements are found as they wrote them, whatever the client put before them. The walk costs
// time for the hops it reads and no memory for the header's length.
//
// A Forwarded element the walk has to read (every element on its right came from a trusted
// proxy) that breaks RFC 7239's syntax, an unbalanced quote say, makes Key fail with an error
// wrapping ErrMalformedHeader (httplimit answers it with 400, grpclimit with InvalidArgument),
// for that request alone. Key does not fall back to the proxy's own address: every client
// behind the proxy shares that key, and one client sending malformed headers would spend it
// for all of them. X-Forwarded-For has no quoting, so a comma always ends a hop there.
//
// # Unix sockets
//
// A server listening on a Unix socket sees no IP address: Go writes the peer of such a
// connection as "@" on Linux (an unnamed socket), "" where the system reports no address, or
// the path the client bound. Key refuses those
// peers with ErrUnixSocket unless WithTrustedUnixSocket is given: then the socket's peer is a
// trusted proxy (the reverse proxy in front of the server, normally the only process that can
// reach the socket), the forwarding header is read from it, and a request without one is
// keyed UnixSocketKey.
package clientaddr

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
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

// UnixSocketKey is the key of a request from a trusted Unix-socket peer
// (WithTrustedUnixSocket) that names no client in its forwarding header: the proxy's own key,
// as a trusted proxy's address is when it forwards no header. No address is written this way.
const UnixSocketKey = "unix"

// ErrUnixSocket is wrapped by Key's error for a peer on a Unix socket ("@", "" or a path)
// when the Resolver does not trust Unix sockets: such a peer has no IP address to key by.
// WithTrustedUnixSocket reads the client's address from the forwarding header the proxy on
// the socket writes.
var ErrUnixSocket = errors.New("clientaddr: the peer is on a Unix socket, which has no IP address")

// ErrMalformedHeader is wrapped by Key's error when the forwarding header breaks its syntax
// where Key has to read it: a Forwarded element whose quotes do not balance, say, with only
// trusted proxies' elements on its right. The request has no key; see the package doc for why
// it does not fall back to the proxy's address.
var ErrMalformedHeader = errors.New("clientaddr: malformed forwarding header")

// Resolver tells a request's client key by its rules. Make one with New; it is safe for
// concurrent use.
type Resolver struct {
	trusted     []netip.Prefix
	trustedUnix bool
	header      Header
	ipv6Bits    int
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

// WithTrustedUnixSocket makes a peer on a Unix socket a trusted proxy, for servers that
// listen on one behind a reverse proxy: the forwarding header it sends is read, walking it
// right to left as for WithTrustedProxies, and a request without one is keyed UnixSocketKey.
// A Unix-socket peer is one whose address is empty, starts with '@' (Linux's unnamed or
// abstract sockets, as Go writes them: "@") or starts with '/' (a path the client bound).
// Without it such peers have no key (ErrUnixSocket). Give it only when every process that
// can connect to the socket is a proxy that overwrites or appends to the header.
func WithTrustedUnixSocket() Option { return func(r *Resolver) { r.trustedUnix = true } }

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
// RemoteAddr and gRPC's peer address are written, a bare address, or a Unix socket's address:
// see WithTrustedUnixSocket), whose lines of the Header() header are lines (read only when
// peer is a trusted proxy).
//
// It is peer's address, or, when peer is a trusted proxy, the first untrusted address of the
// forwarding header read right to left, from the end of the last line. Every hop to the right
// of that one was written by a trusted proxy, so a client can only prepend text, which is never
// read: a Forwarded element is parsed from its end, so a quote the client leaves open cannot
// reach into the elements on its right. A hop a trusted proxy wrote that is no address (RFC
// 7239's "unknown" or an obfuscated identifier) is the key as it is; a hop that names no one
// (an empty entry, an element without for=) makes the last trusted proxy the client; when every
// hop is trusted, the leftmost is the client. An IPv6 address is then keyed by its prefix
// (WithIPv6Prefix). A trusted Unix-socket peer that forwards no client is UnixSocketKey.
//
// The error wraps ErrUnixSocket for a Unix-socket peer without WithTrustedUnixSocket, and
// ErrMalformedHeader for a Forwarded element Key has to read that breaks RFC 7239's syntax;
// such a request has no key rather than the proxy's (see the package doc). Any other peer that
// is not an IP address is an error too.
func (r *Resolver) Key(peer string, lines []string) (string, error) {
	var addr netip.Addr // the peer's address; invalid for a Unix socket
	if isUnixSocket(peer) {
		if !r.trustedUnix {
			return "", fmt.Errorf("%w (peer %q): use WithTrustedUnixSocket to trust the proxy in front of the socket and "+
				"read the client's address from its forwarding header", ErrUnixSocket, peer)
		}
	} else {
		a, err := parseHostPort(peer)
		if err != nil {
			return "", err
		}
		if !isTrusted(a, r.trusted) {
			return r.addrKey(a), nil
		}
		addr = a
	}
	client := addr
	hops := hopWalker{header: r.header, lines: lines}
	for {
		raw, ok, err := hops.next()
		if err != nil {
			return "", err
		}
		if !ok || raw == "" {
			break // no hop left, or one that names no one: the last trusted proxy is the client
		}
		hop, isAddr := parseHop(raw)
		if !isAddr {
			return raw, nil
		}
		client = hop
		if !isTrusted(hop, r.trusted) {
			break
		}
	}
	if !client.IsValid() {
		return UnixSocketKey, nil
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

// isUnixSocket reports whether peer is the address of a Unix socket as Go writes it: "" (an
// unnamed socket where the system reports no address), "@" or "@name" (Linux's unnamed and
// abstract sockets) or a path the client bound. No IP address or "host:port" starts so.
func isUnixSocket(peer string) bool { return peer == "" || peer[0] == '@' || peer[0] == '/' }

// parseHostPort reads a peer's address: "host:port" as net/http's RemoteAddr and gRPC's peer
// address write it, or a bare address.
func parseHostPort(s string) (netip.Addr, error) {
	host, _, err := net.SplitHostPort(s)
	if err != nil {
		host = s
	}
	a, err := netip.ParseAddr(host)
	if err != nil {
		return netip.Addr{}, fmt.Errorf("clientaddr: peer address %q is not an IP address", s)
	}
	return a.WithZone("").Unmap(), nil
}
