//go:build !linux

package main

import (
	"errors"
	"time"
)

// processCPU needs /proc: elsewhere the report leaves the server's CPU time out.
func processCPU(int) (time.Duration, error) {
	return 0, errors.New("bench: process CPU time needs /proc (Linux)")
}
