// Package scripts holds strictrate's Lua scripts, embedded from the .lua files beside it.
//
// Each file opens with a comment that lists its KEYS, ARGV and reply; the engine package is
// the only code that should depend on those shapes.
package scripts

import _ "embed"

//go:embed sliding_window.lua
var slidingWindow string

//go:embed sliding_window_peek.lua
var slidingWindowPeek string

// SlidingWindow returns the source of the atomic decision script: trim, count, add the events
// only when they fit, and set the key's expiry, all in one call.
func SlidingWindow() string { return slidingWindow }

// SlidingWindowPeek returns the source of the read-only script that takes the same decision as
// SlidingWindow without recording anything.
func SlidingWindowPeek() string { return slidingWindowPeek }
