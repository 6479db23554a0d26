package transport

import (
	"testing"
)

// A node is named as valkey-go names it: the endpoint CLUSTER SLOTS gives and the port, the
// asked node's host when the endpoint is empty, nothing when it is unknown.
func TestNodeAddrNamesANodeAsValkeyGoDoes(t *testing.T) {
	for _, tc := range []struct {
		from, endpoint string
		port           int64
		want           string
	}{
		{"127.0.0.1:7000", "127.0.0.1", 7001, "127.0.0.1:7001"},
		{"127.0.0.1:7000", "", 7001, "127.0.0.1:7001"},
		{"10.0.0.1:7000", "cache-2.internal", 6379, "cache-2.internal:6379"},
		{"[::1]:7000", "", 7002, "[::1]:7002"},
		{"127.0.0.1:7000", "?", 7001, ""},
	} {
		if got := nodeAddr(tc.from, tc.endpoint, tc.port); got != tc.want {
			t.Errorf("nodeAddr(%q, %q, %d) = %q, want %q", tc.from, tc.endpoint, tc.port, got, tc.want)
		}
	}
}
