// Package strictrate is exact rate limiting on Valkey, for limits that are a promise: login
// attempts, one-time codes, payment retries, paid API quotas. This package declares nothing;
// it is the map of the repository. Start with package engine, whose doc names the few calls
// most programs need.
//
// The libraries:
//
//   - [github.com/strictrate/strictrate/engine]: the limiter. A sliding window log whose every
//     decision (trim, count, add only when admitted, expire) is one Lua script call, so the
//     count is exact under any concurrency, from any number of processes; weighted costs,
//     refunds, several limits on a key, long and calendar quotas, requests on several keys
//     decided together, in-flight limits (leases), against one Valkey or a cluster.
//   - [github.com/strictrate/strictrate/httplimit]: net/http middleware: keys a request by its
//     client's address (or a header, or a function of yours), answers a denial with 429 and
//     Retry-After, sends the IETF RateLimit header fields; NewConcurrent bounds requests in
//     flight.
//   - github.com/strictrate/strictrate/grpclimit (a module of its own, so that this one does
//     not depend on gRPC): unary and stream server interceptors with httplimit's keys and rules.
//   - [github.com/strictrate/strictrate/clientaddr]: a client's address behind trusted proxies
//     (X-Forwarded-For or Forwarded, read from the right), IPv6 keyed by its /64.
//   - [github.com/strictrate/strictrate/clientkey]: the keys both middlewares give a client, for
//     a middleware of your own that shares their counts.
//   - [github.com/strictrate/strictrate/fields]: the RateLimit-Policy and RateLimit field
//     values (draft-ietf-httpapi-ratelimit-headers) of a policy and a decision.
//   - [github.com/strictrate/strictrate/inspect]: a key's log as stored, for operators and
//     tests.
//   - [github.com/strictrate/strictrate/pipelined]: the common non-atomic design
//     (ZREMRANGEBYSCORE, ZADD, ZCARD and PEXPIRE in a pipeline), kept to measure the engine
//     against, and the classic Check, Record and Clear interface, which the engine implements.
//   - [github.com/strictrate/strictrate/loader] and [github.com/strictrate/strictrate/scripts]:
//     the engine's own (script handles on valkey-go's script cache, and the Lua sources).
//     Programs have no reason to import them; their shapes change with the engine.
//
// The programs:
//
//   - [github.com/strictrate/strictrate/cmd/strictrate]: the operator's command: "inspect"
//     shows a key's log and what each limit has remaining, "reset" deletes it.
//   - github.com/strictrate/strictrate/bench (a module of its own, so that this one does not
//     depend on its charts' plotting): the benchmark (go run ./bench, through the repository's
//     go.work): the engine against the pipelined design on a throwaway Valkey; exactness,
//     throughput, memory, server cost, leases, durability, clusters, quotas, local quota; a
//     summary of each figure against its target, and an exit status that says whether
//     exactness held.
//   - github.com/strictrate/strictrate/rls (a module of its own): strictrate-rls, Envoy's rate
//     limit service on the engine, a drop-in for envoyproxy/ratelimit.
//   - github.com/strictrate/strictrate/examples (a module of its own): the README's quick
//     start (examples/quickstart), and a small HTTP server limited by httplimit, with its
//     metrics on /metrics.
//
// The packages under internal/ are the module's own and promise nothing across releases:
// throwaway Valkey servers for the tests and the benchmark (valkeytest), the helpers the tests
// share (enginetest), the nodes a client knows (nodes), and the contexts the engine hands
// valkey-go (sendctx).
//
// The README is the front page; docs/ has the rest: limits, HTTP and gRPC, Envoy's service,
// leases, production, operating, benchmarks and design (with a glossary).
package strictrate
