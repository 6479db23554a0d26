package pipelined

import (
	"fmt"
	"testing"
)

// Members are unique within an engine and across engines, and compact.
func TestMembersAreUniqueAndCompact(t *testing.T) {
	seen := map[string]bool{}
	for i := 0; i < 3; i++ {
		e := &Engine{}
		copy(e.memberID[:], fmt.Sprintf("engine%02d", i))
		for j := 0; j < 100_000; j++ {
			m := e.nextMember()
			if seen[m] {
				t.Fatalf("member %q made twice", m)
			}
			if len(m) > 8+3 {
				t.Fatalf("member %d is %d bytes, want at most 11 below 2^21 events", j, len(m))
			}
			seen[m] = true
		}
	}
}
