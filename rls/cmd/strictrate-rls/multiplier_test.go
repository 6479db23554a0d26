package main

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/strictrate/strictrate/internal/valkeytest"
)

// quarterConfig limits each remote address to 3 requests per 3 months (unit_multiplier).
func quarterConfig(multiplier string) string {
	return `domain: edge
descriptors:
  - key: remote_address
    rate_limit:
      unit: month
      unit_multiplier: ` + multiplier + `
      requests_per_unit: 3
`
}

// TestUnitMultiplierAtStart: a rule's unit_multiplier that is not a whole number of units is
// refused at start, naming the file, the line, the rule and the value; so is one of several
// months under STRICTRATE_CALENDAR=true, which counts one calendar month at a time. Without
// it, the rule is a window of 3 months: /rlconfig shows it, and current_limit carries it.
// RESPONSE_DYNAMIC_METADATA=true is honoured, without a warning.
func TestUnitMultiplierAtStart(t *testing.T) {
	valkeytest.SkipIfShort(t, "runs the strictrate-rls command as a process")
	t.Parallel()
	root := t.TempDir()
	file := filepath.Join(root, "ratelimit", "config", "quarter.yaml")
	writeFile(t, file, quarterConfig("-3"))
	refusedAtStart(t, fileEnv(t, root), "quarter.yaml", "line 6", "unit_multiplier -3 of 'edge.remote_address' is not a whole number of units")

	writeFile(t, file, quarterConfig("3"))
	e := fileEnv(t, root)
	e["STRICTRATE_CALENDAR"] = "true"
	refusedAtStart(t, e, "quarter.yaml", "line 6", "unit_multiplier 3 of 'edge.remote_address'", "STRICTRATE_CALENDAR=true")

	e = fileEnv(t, root)
	e["RESPONSE_DYNAMIC_METADATA"] = "true"
	p := start(t, e)
	p.waitConfig("edge.remote_address: unit=MONTH unit_multiplier=3 requests_per_unit=3")
	c := dial(t, p.grpc)
	resp := respond(t, c, request("edge", "remote_address", "10.0.0.3"))
	if l := resp.GetStatuses()[0].GetCurrentLimit(); l.GetRequestsPerUnit() != 3 || l.GetUnit().String() != "MONTH" || l.GetUnitMultiplier().GetValue() != 3 {
		t.Errorf("current_limit %v, want 3 per 3 months", l)
	}
	if got := resp.GetDynamicMetadata().GetFields()["domain"].GetStringValue(); got != "edge" {
		t.Errorf("dynamic_metadata %v, want the reference's, with domain edge", resp.GetDynamicMetadata())
	}
	if got := decisions(t, c, request("edge", "remote_address", "10.0.0.3"), 3); got != want(2, 1) {
		t.Errorf("3 more requests against 3 per 3 months: %s, want %s", got, want(2, 1))
	}
	if strings.Contains(p.log.String(), "RESPONSE_DYNAMIC_METADATA") {
		t.Errorf("the log names RESPONSE_DYNAMIC_METADATA, which is supported:\n%s", p.log)
	}
}
