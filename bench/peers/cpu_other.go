//go:build !unix

package main

import "time"

// processCPU is not measured where getrusage is missing; the client CPU column reads 0.
func processCPU() time.Duration { return 0 }
