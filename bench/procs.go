package main

import "runtime"

// testingProcs is GOMAXPROCS, which RunParallel multiplies by its parallelism.
func testingProcs() int { return runtime.GOMAXPROCS(0) }
