// Package config reads the reference rate limit service's configuration (envoyproxy/ratelimit):
// YAML files, or RateLimitConfig resources from an xDS server, into a Config that answers which
// rule limits a request's descriptor.
//
// Most callers need four names: LoadDir (or Parse, or FromProto) to build a Config, Watch to
// keep one current as the files change, and Config.Match (Config.Override when the request
// carries its own limit) to find the rule of a descriptor.
//
// What is accepted and what is rejected follow the reference exactly: every key it knows is
// accepted anywhere in a file (a key it does not know is refused), the same values are
// refused for the same reasons, and matching walks the descriptor tree as it does (see
// Config.Match). One refusal is this package's own: a requests_per_unit above
// MaxRequestsPerUnit, which the engine cannot decide exactly. One key is too: a rule's
// rate_limit may say unit_multiplier, the number of units in its window (unit: second,
// unit_multiplier: 30 is a window of 30 seconds; the name of Envoy's newer API), an integer of
// 1 or more (0 or none is 1). One that is not, one outside a rate_limit, and one above 1 on a
// calendar unit under WithCalendar are refused, naming the rule. And a descriptor may say
// record_over_limit: true, beside shadow_mode: its rule counts usage reported after the fact
// (RateLimit.RecordOverLimit); one without a rate_limit beside it, beside unlimited: true, or
// anywhere but beside a descriptor's key is refused. Every refusal is an *Error
// that wraps ErrInvalid and names the file, the line where it is known, and the reason in the
// reference's words.
//
// A file:
//
//	domain: edge
//	descriptors:
//	  - key: remote_address          # a key without a value: any value, one counter each
//	    rate_limit: {unit: minute, requests_per_unit: 10}
//	  - key: remote_address
//	    value: 10.0.0.1              # a key and value without rate_limit: exempt from the above
//	  - key: path
//	    value: /api/*                # a value ending in '*': a prefix
//	    share_threshold: true        # every matching value shares one counter
//	    rate_limit: {unit: second, requests_per_unit: 100, name: api}
//	  - key: tenant
//	    rate_limit: {unit: second, unit_multiplier: 30, requests_per_unit: 1000}  # per 30 s
//	  - key: tokens
//	    record_over_limit: true      # reports of tokens used are counted in full, over or not
//	    rate_limit: {unit: hour, requests_per_unit: 1000}
package config
