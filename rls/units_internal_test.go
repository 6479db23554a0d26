package rls

import (
	"strings"
	"testing"

	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"

	"github.com/strictrate/strictrate/rls/config"
)

// Every unit crosses the enums by its number and keeps its name: the response's enum names it
// as config does, a request's override of that number is that unit, and its calendar period
// (when it has one) is the period of its name. Any other number is UNKNOWN everywhere.
func TestUnitsAcrossTheEnums(t *testing.T) {
	for u := config.Second; u <= config.Week; u++ {
		if got := protoUnit(u); got.String() != strings.ToUpper(u.String()) {
			t.Errorf("unit %s answers as %s", u, got)
		}
		if got := overrideUnit(typev3.RateLimitUnit(u)); got != u {
			t.Errorf("an override of unit %d reads as %s, want %s", u, got, u)
		}
		if p := u.CalendarPeriod(); p != 0 && p.String() != u.String() {
			t.Errorf("unit %s is counted by the calendar's %s", u, p)
		}
	}
	for _, n := range []int{0, 8, 42, -1} {
		if got := protoUnit(config.Unit(n)); got != pb.RateLimitResponse_RateLimit_UNKNOWN {
			t.Errorf("number %d answers as %s, want UNKNOWN", n, got)
		}
		if got := overrideUnit(typev3.RateLimitUnit(n)); got != config.UnitUnknown {
			t.Errorf("an override of number %d reads as %s, want UnitUnknown", n, got)
		}
	}
}
