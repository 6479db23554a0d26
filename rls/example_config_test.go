package rls_test

import (
	"testing"

	"github.com/strictrate/strictrate/rls/config"
)

// The example configuration next to examples/envoy.yaml loads, and limits what its comments
// say: an address per minute, logins and API paths more tightly, health checks not at all.
func TestExampleConfig(t *testing.T) {
	c, err := config.LoadDir("examples/config", true)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		entries []config.Entry
		rpu     uint32
		unit    config.Unit
	}{
		{[]config.Entry{{Key: "remote_address", Value: "10.0.0.1"}}, 100, config.Minute},
		{[]config.Entry{{Key: "remote_address", Value: "10.0.0.1"}, {Key: "path", Value: "/login"}}, 5, config.Minute},
		{[]config.Entry{{Key: "remote_address", Value: "10.0.0.1"}, {Key: "path", Value: "/api/orders"}}, 20, config.Second},
	} {
		m := c.Match("edge", tc.entries)
		if m.Limit == nil || m.Limit.RequestsPerUnit != tc.rpu || m.Limit.Unit != tc.unit {
			t.Fatalf("%v: %+v, want %d per %s", tc.entries, m.Limit, tc.rpu, tc.unit)
		}
	}
	if m := c.Match("edge", []config.Entry{{Key: "remote_address", Value: "10.0.0.1"}, {Key: "path", Value: "/healthz"}}); m.Limit != nil {
		t.Fatalf("/healthz is limited: %+v", m.Limit)
	}
}
