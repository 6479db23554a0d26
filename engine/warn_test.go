package engine_test

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"

	"github.com/strictrate/strictrate/engine"
	"github.com/strictrate/strictrate/internal/valkeytest"
)

// A node that keeps the logs only in memory is warned about once per process, through the
// engine's slog logger, however many engines are made on it; the warning names the node.
func TestPersistenceWarningOncePerNode(t *testing.T) {
	own := valkeytest.New(t, valkeytest.OwnServer()) // a server (run_id) no other test warned about
	var buf bytes.Buffer
	logger := slog.New(slog.NewTextHandler(&buf, nil))
	for range 5 {
		if _, err := engine.New(own.Client(t), engine.WithLogger(logger), engine.WithPersistenceCheck(engine.Warn)); err != nil {
			t.Fatal(err)
		}
	}
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != 1 || !strings.Contains(lines[0], "level=WARN") || !strings.Contains(lines[0], own.Addr) {
		t.Fatalf("warnings after 5 engines on one node: %q, want one WARN naming %s", buf.String(), own.Addr)
	}
	// Refusing is not warning: it still fails every New.
	if _, err := engine.New(own.Client(t), engine.WithPersistenceCheck(engine.Refuse)); err == nil {
		t.Fatal("Refuse on a node without persistence: New succeeded")
	}
}
