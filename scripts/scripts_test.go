package scripts

import (
	"strings"
	"testing"
)

// Each script opens with the header the engine codes against: KEYS, ARGV and the reply.
func TestScriptsDocumentTheirShape(t *testing.T) {
	for name, src := range map[string]string{
		"sliding_window.lua":      SlidingWindow(),
		"sliding_window_peek.lua": SlidingWindowPeek(),
	} {
		if !strings.HasPrefix(src, "-- "+name+":") {
			t.Errorf("%s does not open with its name", name)
		}
		for _, part := range []string{"KEYS[1]", "ARGV[1]", "ARGV[2]", "ARGV[3]", "ARGV[4]", "Reply:"} {
			if !strings.Contains(src, "-- "+part) && !strings.Contains(src, "--   "+part) {
				t.Errorf("%s header does not document %s", name, part)
			}
		}
	}
}
