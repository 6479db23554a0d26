package main

import (
	"strings"
	"testing"
	"time"

	"github.com/strictrate/strictrate/internal/valkeytest"
)

// The cluster scenario, small and short, on a cluster of its own: one row unbatched (one
// decision per script call) and one batched, whose calls carry several decisions on keys of
// many slots, both deciding every request without error.
func TestClusterScenario(t *testing.T) {
	valkeytest.SkipIfShort(t, "runs the bench program's cluster scenario on a cluster of its own")
	r, out, _ := runBench(t, config{Duration: 500 * time.Millisecond, Concurrency: 32, Clients: 2, Keys: 1000, Limit: 20,
		Window: time.Second, Scenario: "cluster"})
	for _, want := range []string{"### Cluster: 3 primaries, 1000 keys", "| atomic |", "| batched |", "batched / atomic (unbatched)"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("Markdown output lacks %q:\n%s", want, out.String())
		}
	}
	if len(r.Cluster) != 2 || r.Cluster[0].Mode != "atomic" || r.Cluster[1].Mode != "batched" {
		t.Fatalf("cluster rows: %+v, want atomic then batched", r.Cluster)
	}
	unbatched, batched := r.Cluster[0], r.Cluster[1]
	if unbatched.MeanBatch < 0.99 || unbatched.MeanBatch > 1.01 {
		t.Errorf("unbatched: %.2f decisions per script call, want 1", unbatched.MeanBatch)
	}
	if batched.MeanBatch < 1.5 {
		t.Errorf("batched: %.2f decisions per script call on 1000 keys, want batches across slots", batched.MeanBatch)
	}
	for _, row := range r.Cluster {
		if row.Decisions == 0 || row.DecisionsPerSec <= 0 || row.AdmittedShare <= 0 || row.Primaries != 3 || row.Keys != 1000 {
			t.Errorf("%s row: %+v", row.Mode, row)
		}
	}
}
