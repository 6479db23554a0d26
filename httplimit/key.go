package httplimit

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"strings"
)

// clientIP returns the address of the client that sent r, as the key: RemoteAddr's host, or,
// when RemoteAddr is a trusted proxy, the first untrusted address of the forwarding header
// read right to left. Every hop to the right of that one was written by a trusted proxy, so
// a client can only prepend addresses, which are never read. A hop a trusted proxy wrote that
// is no address (RFC 7239's "unknown" or an obfuscated identifier) is the key as it is; when
// every hop is trusted, the leftmost is the client.
func clientIP(r *http.Request, trusted []netip.Prefix, header ForwardedHeader) (string, error) {
	peer, err := parseHostPort(r.RemoteAddr)
	if err != nil {
		return "", fmt.Errorf("RemoteAddr %q: %w", r.RemoteAddr, err)
	}
	if !isTrusted(peer, trusted) {
		return peer.String(), nil
	}
	var hops []string
	if header == Forwarded {
		hops = forwardedFor(r.Header.Values("Forwarded"))
	} else {
		hops = xForwardedFor(r.Header.Values("X-Forwarded-For"))
	}
	client := peer.String()
	for i := len(hops) - 1; i >= 0; i-- {
		addr, ok := parseHop(hops[i])
		if !ok {
			if hops[i] == "" {
				return client, nil // an empty hop says nothing: the last trusted proxy is the client
			}
			return hops[i], nil
		}
		client = addr.String()
		if !isTrusted(addr, trusted) {
			break
		}
	}
	return client, nil
}

func isTrusted(a netip.Addr, trusted []netip.Prefix) bool {
	for _, p := range trusted {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// parseHostPort reads RemoteAddr: "host:port" as net/http's server sets it, or a bare address.
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
