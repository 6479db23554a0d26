package config

import (
	"fmt"
	"strings"
	"time"
)

// Unit is the period a rule's requests_per_unit is counted over. Its values are the numbers of
// Envoy's RateLimitResponse.RateLimit.Unit (and of the xDS RateLimitUnit), so converting to or
// from those enums is a plain conversion: Unit(x) and int32(u).
type Unit int

// The units, with the numbers of Envoy's enums.
const (
	UnitUnknown Unit = 0
	Second      Unit = 1
	Minute      Unit = 2
	Hour        Unit = 3
	Day         Unit = 4
	Month       Unit = 5
	Year        Unit = 6
	Week        Unit = 7
)

var unitNames = [...]string{
	UnitUnknown: "unknown", Second: "second", Minute: "minute", Hour: "hour", Day: "day",
	Month: "month", Year: "year", Week: "week",
}

// Duration is the unit's length as the reference defines it: a month is 30 days and a year
// 365 days, whatever the calendar says. It is 0 for UnitUnknown and any other value.
func (u Unit) Duration() time.Duration {
	switch u {
	case Second:
		return time.Second
	case Minute:
		return time.Minute
	case Hour:
		return time.Hour
	case Day:
		return 24 * time.Hour
	case Week:
		return 7 * 24 * time.Hour
	case Month:
		return 30 * 24 * time.Hour
	case Year:
		return 365 * 24 * time.Hour
	}
	return 0
}

// String is the unit's name in lower case, as configuration files usually write it: "second",
// "minute"... "unknown" for UnitUnknown and any value that is not a unit.
func (u Unit) String() string {
	if u >= 0 && int(u) < len(unitNames) {
		return unitNames[u]
	}
	return "unknown"
}

// ParseUnit reads a unit's name in any case ("minute", "MINUTE", "Minute"), as the reference
// does. "unknown" is not a unit: it is refused, as the reference refuses it.
func ParseUnit(s string) (Unit, error) {
	up := strings.ToUpper(s)
	for u := Second; u <= Week; u++ {
		if up == strings.ToUpper(unitNames[u]) {
			return u, nil
		}
	}
	return UnitUnknown, fmt.Errorf("config: invalid rate limit unit '%s'", s)
}
