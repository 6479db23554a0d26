package config

import (
	"fmt"
	"strings"
	"time"

	"github.com/strictrate/strictrate/engine"
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

// units is what each unit is, by its number: the one table that names, lengths, calendar
// periods and the check that a number is a unit at all (the enums' and the files') read.
var units = [...]struct {
	name   string
	length time.Duration // as the reference counts it: a month is 30 days, a year 365
	period engine.Period // the calendar period it names; 0: none (a sliding window only)
}{
	UnitUnknown: {name: "unknown"},
	Second:      {name: "second", length: time.Second},
	Minute:      {name: "minute", length: time.Minute},
	Hour:        {name: "hour", length: time.Hour},
	Day:         {name: "day", length: 24 * time.Hour, period: engine.Day},
	Month:       {name: "month", length: 30 * 24 * time.Hour, period: engine.Month},
	Year:        {name: "year", length: 365 * 24 * time.Hour, period: engine.Year},
	Week:        {name: "week", length: 7 * 24 * time.Hour, period: engine.Week},
}

// inTable reports whether u has a row in units: a unit, or UnitUnknown.
func (u Unit) inTable() bool { return u >= 0 && int(u) < len(units) }

// Duration is the unit's length as the reference defines it: a month is 30 days and a year
// 365 days, whatever the calendar says. It is 0 for UnitUnknown and any other value, so a
// number names a unit exactly when its Duration is not 0.
func (u Unit) Duration() time.Duration {
	if !u.inTable() {
		return 0
	}
	return units[u].length
}

// CalendarPeriod is the calendar period the unit names (engine.Day for Day, and so on for
// Week, Month and Year), which the service counts it by under rls.WithCalendar; 0 for the
// units no calendar has (second, minute, hour) and for any value that is not a unit.
func (u Unit) CalendarPeriod() engine.Period {
	if !u.inTable() {
		return 0
	}
	return units[u].period
}

// String is the unit's name in lower case, as configuration files usually write it: "second",
// "minute"... "unknown" for UnitUnknown and any value that is not a unit.
func (u Unit) String() string {
	if !u.inTable() {
		return units[UnitUnknown].name
	}
	return units[u].name
}

// ParseUnit reads a unit's name in any case ("minute", "MINUTE", "Minute"), as the reference
// does (it upper-cases the name and looks it up in the enum). "unknown" is not a unit: it is
// refused, as the reference refuses it.
func ParseUnit(s string) (Unit, error) {
	up := strings.ToUpper(s)
	for u := Second; int(u) < len(units); u++ {
		if up == strings.ToUpper(units[u].name) {
			return u, nil
		}
	}
	return UnitUnknown, fmt.Errorf("config: invalid rate limit unit '%s'", s)
}
