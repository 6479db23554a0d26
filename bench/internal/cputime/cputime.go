// Package cputime reads this process's CPU time, for the benchmarks' client CPU per decision:
// the main bench (bench) and the comparison with other limiters (bench/peers) measure it
// the same way, from this one place.
//
// bench/peers is a module of its own that builds against the core module at the same commit
// (its go.mod replaces it with ../..); its import path is under bench, so the internal rule
// lets it import this package. Neither is a library, so the package promises nothing across
// releases.
package cputime
