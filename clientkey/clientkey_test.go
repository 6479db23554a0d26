package clientkey_test

import (
	"errors"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/strictrate/strictrate/clientaddr"
	"github.com/strictrate/strictrate/clientkey"
	"github.com/strictrate/strictrate/engine"
)

var errKey = errors.New("mw: no rate-limit key")

// The layout of an engine key: prefix, the policy's tag (the same for the limits in any
// order), ":".
func TestPrefix(t *testing.T) {
	p := engine.Policy{engine.PerSecond(5), engine.PerHour(100)}
	if got, want := clientkey.Prefix("http:", p), "http:"+p.Tag()+":"; got != want {
		t.Fatalf("Prefix = %q, want %q", got, want)
	}
	if clientkey.Prefix("x:", engine.Policy{p[1], p[0]}) != clientkey.Prefix("x:", p) {
		t.Fatal("Prefix depends on the order of the limits")
	}
	if clientkey.Prefix("x:", engine.Policy{{Max: 5, Window: time.Second}}) == clientkey.Prefix("x:", p) {
		t.Fatal("different policies, one prefix")
	}
}

// Checked and FromAddr: the key, or errKey wrapping the reason, with the messages the
// middlewares have always written.
func TestChecked(t *testing.T) {
	errFunc := errors.New("no user")
	for _, tc := range []struct {
		key     string
		err     error
		wantErr string // "" for the key back
	}{
		{"user:ann", nil, ""},
		{strings.Repeat("k", clientkey.MaxLength), nil, ""},
		{strings.Repeat("k", clientkey.MaxLength+1), nil, "mw: no rate-limit key: key of 513 bytes, more than 512"},
		{"", nil, "mw: no rate-limit key: empty key"},
		{"user:ann", errFunc, "mw: no rate-limit key: no user"},
	} {
		key, err := clientkey.Checked(errKey, tc.key, tc.err)
		if tc.wantErr == "" {
			if err != nil || key != tc.key {
				t.Errorf("Checked(%.20q, %v) = %q, %v; want the key", tc.key, tc.err, key, err)
			}
			continue
		}
		if err == nil || err.Error() != tc.wantErr || !errors.Is(err, errKey) || key != "" ||
			(tc.err != nil && !errors.Is(err, tc.err)) {
			t.Errorf("Checked(%.20q, %v) = %q, %v; want %q wrapping errKey", tc.key, tc.err, key, err, tc.wantErr)
		}
	}
	if clientkey.MaxLength != 512 {
		t.Fatalf("MaxLength %d, want 512", clientkey.MaxLength)
	}
}

func TestFromAddr(t *testing.T) {
	r, err := clientaddr.New(clientaddr.WithHeader(clientaddr.Forwarded), clientaddr.WithTrustedProxies(
		netipPrefix(t, "10.0.0.0/8")))
	if err != nil {
		t.Fatal(err)
	}
	if key, err := clientkey.FromAddr(errKey, r, "192.0.2.1:1234", nil, "use X"); err != nil || key != "192.0.2.1" {
		t.Fatalf("plain peer: %q, %v", key, err)
	}
	key, err := clientkey.FromAddr(errKey, r, "@", nil, "use X")
	if want := "; or use X"; err == nil || !errors.Is(err, errKey) || !errors.Is(err, clientaddr.ErrUnixSocket) ||
		!strings.HasPrefix(err.Error(), "mw: no rate-limit key: clientaddr: ") || !strings.HasSuffix(err.Error(), want) || key != "" {
		t.Fatalf("Unix socket: %q, %v; want errKey and ErrUnixSocket, ending %q", key, err, want)
	}
	_, err = clientkey.FromAddr(errKey, r, "10.0.0.1:1", []string{`for="192.0.2.1`}, "use X")
	if !errors.Is(err, errKey) || !errors.Is(err, clientaddr.ErrMalformedHeader) || strings.Contains(err.Error(), "use X") {
		t.Fatalf("malformed Forwarded: %v; want errKey and ErrMalformedHeader, without the advice", err)
	}
	long := "_" + strings.Repeat("x", clientkey.MaxLength) // an obfuscated identifier, kept as it is
	_, err = clientkey.FromAddr(errKey, r, "10.0.0.1:1", []string{"for=" + long}, "use X")
	if !errors.Is(err, errKey) || !strings.HasSuffix(err.Error(), "key of 513 bytes, more than 512") {
		t.Fatalf("long forwarded identifier: %v; want errKey, too long", err)
	}
}

func netipPrefix(t *testing.T, s string) netip.Prefix {
	t.Helper()
	p, err := netip.ParsePrefix(s)
	if err != nil {
		t.Fatal(err)
	}
	return p
}
