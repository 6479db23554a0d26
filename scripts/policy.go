package scripts

import _ "embed"

//go:embed sliding_window_policy.lua
var slidingWindowPolicy string

// SlidingWindowPolicy returns the source of the atomic decision script for several limits on
// one key: trim to the longest window, count every window, add the events only when every
// limit has room, and set the key's expiry, all in one call.
func SlidingWindowPolicy() string { return slidingWindowPolicy }
