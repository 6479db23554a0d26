package valkeytest

import "testing"

// SkipIfShort skips tb under go test -short, saying why it is slow: it starts a cluster, OS
// processes, kills a server to see what survives, or runs the whole bench program. Every such
// test of the core module and of rls calls it first, so that -short leaves the tests that run
// in seconds on one server.
func SkipIfShort(tb testing.TB, why string) {
	tb.Helper()
	if testing.Short() {
		tb.Skip("skipped with -short: " + why)
	}
}
