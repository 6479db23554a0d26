package engine

import (
	"testing"
)

func TestInfoFieldMatchesTheWholeName(t *testing.T) {
	text := "# Persistence\r\naof_enabled:1\r\naof_enabled_extra:9\r\n# Replication\r\nrole:master\r\nconnected_slaves:0"
	for name, want := range map[string]string{"aof_enabled": "1", "role": "master", "connected_slaves": "0", "absent": ""} {
		if got := infoField(text, name); got != want {
			t.Errorf("infoField(%q) = %q, want %q", name, got, want)
		}
	}
}
