package config

import (
	"errors"
	"fmt"
)

// ErrInvalid is wrapped by every refusal of a configuration: errors.Is(err, ErrInvalid) tells a
// bad configuration (keep the last good one and fix the file) from a failure to read or watch
// the files.
var ErrInvalid = errors.New("config: invalid rate limit configuration")

// Error is a refused configuration: which file (or xDS resource), where in it, and why, in the
// reference's words where it has them ("duplicate domain 'x' in config file").
type Error struct {
	File   string // the file's name relative to the directory read, or the xDS resource's name
	Line   int    // the line in the file the reason is about; 0 when not known (xDS)
	Reason string
}

func (e *Error) Error() string {
	if e.Line > 0 {
		return fmt.Sprintf("config: %s: line %d: %s", e.File, e.Line, e.Reason)
	}
	return fmt.Sprintf("config: %s: %s", e.File, e.Reason)
}

// Is makes errors.Is(err, ErrInvalid) true.
func (e *Error) Is(target error) bool { return target == ErrInvalid }

func invalid(file string, line int, format string, args ...any) *Error {
	return &Error{File: file, Line: line, Reason: fmt.Sprintf(format, args...)}
}
