// Package rls is Envoy's rate limit service (envoy.service.ratelimit.v3.RateLimitService) on
// a strictrate engine: a drop-in for the reference server, envoyproxy/ratelimit, that reads
// the same configuration and settings and answers the same calls, but decides exactly.
//
// Where the reference keeps a fixed-window counter per descriptor (INCRBY and EXPIRE), so
// that up to twice a limit passes across a window's boundary and a denied request still
// counts against every descriptor it carried, a Service keeps a sliding window log per
// descriptor (package engine) and decides a request's descriptors all or nothing: never more
// than a rule's requests_per_unit in any trailing unit, and a denied request consumes
// nothing, but on the rules that record usage reported after the fact (record_over_limit,
// WithRecordOverLimit: the tokens a response used, reported once it is done). docs/rls.md
// lists every difference.
//
// Most users run the command, rls/cmd/strictrate-rls, configured by the reference's
// environment variables (package settings); package config reads the reference's YAML files
// and xDS resources, and package xds receives the latter from a management server.
//
// rls is a module of its own, github.com/strictrate/strictrate/rls, so that the core module
// requires neither gRPC nor Envoy's protos.
package rls
