package main

import (
	"path/filepath"
	"testing"

	"github.com/strictrate/strictrate/internal/valkeytest"
)

// TestWriteLayoutRefused: STRICTRATE_WRITE_LAYOUT chose the layout an earlier release wrote;
// this one writes one layout, so a deployment that still sets the variable, even to that
// release's default, does not start, and is told to unset it.
func TestWriteLayoutRefused(t *testing.T) {
	valkeytest.SkipIfShort(t, "runs the strictrate-rls command as a process")
	t.Parallel()
	root := t.TempDir()
	writeFile(t, filepath.Join(root, "ratelimit", "config", "edge.yaml"), edgeConfig(1000))
	e := fileEnv(t, root)
	e["STRICTRATE_WRITE_LAYOUT"] = "5"
	refusedAtStart(t, e, "STRICTRATE_WRITE_LAYOUT is no longer a setting", "this release writes one layout", "unset it")
}
