package scripts

import (
	"strings"
	"testing"
)

// The policy script documents its shape like the others, including its repeated ARGV pairs.
func TestPolicyScriptDocumentsItsShape(t *testing.T) {
	const name = "sliding_window_policy.lua"
	src := SlidingWindowPolicy()
	if !strings.HasPrefix(src, "-- "+name+":") {
		t.Errorf("%s does not open with its name", name)
	}
	for _, part := range []string{"KEYS[1]", "ARGV[1]", "ARGV[2]", "ARGV[3]", "ARGV[4]", "Reply:", "[1] remaining", "[3] retry_after", "[4] reset_after"} {
		if !strings.Contains(src, "-- "+part) && !strings.Contains(src, "--   "+part) {
			t.Errorf("%s header does not document %s", name, part)
		}
	}
	// Lua's tostring and .. round numbers above 14 digits: members must not be built that way
	// from the timestamp, only from the %d-formatted stamp.
	for _, bad := range []string{"tostring(now)", "now .. "} {
		if strings.Contains(src, bad) {
			t.Errorf("%s builds a member with %q, which rounds the timestamp", name, bad)
		}
	}
}
