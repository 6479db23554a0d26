// Package strictrate is exact rate limiting on Valkey, for limits that are a promise: login
// attempts, one-time codes, payment retries, paid API quotas. This package holds no code of its
// own; it is the map of the library. The limiter is package [engine]: a sliding window log
// whose every decision (trim, count, add only when admitted, expire) is one Lua script call,
// so the count is exact under any concurrency, from any number of processes.
//
// # Packages
//
//   - [engine]: the limiter. An [engine.Engine] takes rate-limit decisions (one or several
//     limits on a key, weighted costs, refunds) and in-flight limits (leases) against one
//     Valkey deployment, standalone or cluster. The middlewares and the command build on it.
//   - [github.com/strictrate/strictrate/httplimit]: net/http middleware. It keys each request
//     by its client's address (or a header, or a function of yours), decides it against an
//     [engine.Policy], answers a denial with 429 and Retry-After, and sends the IETF RateLimit
//     header fields; NewConcurrent bounds requests in flight.
//   - [github.com/strictrate/strictrate/grpclimit]: gRPC unary and stream server interceptors,
//     with the same keys and rules as httplimit; a denial is codes.ResourceExhausted carrying
//     the exact retry delay. It is a module of its own, so that the core module does not
//     depend on gRPC.
//   - [github.com/strictrate/strictrate/clientaddr]: the address of the client behind trusted
//     proxies, read from the right end of the forwarding header (X-Forwarded-For or RFC 7239's
//     Forwarded), IPv6 keyed by its /64; both middlewares key by it. Use it directly to key a
//     limit of your own by client.
//   - [github.com/strictrate/strictrate/clientkey]: the engine keys both middlewares give a
//     client (a prefix, the policy's tag, the client's key, checked: not empty, at most 512
//     bytes). Use it in a middleware of your own to key clients as they do and share their
//     counts.
//   - [github.com/strictrate/strictrate/fields]: the values of the RateLimit-Policy and
//     RateLimit fields (draft-ietf-httpapi-ratelimit-headers) for a policy and a decision, in a
//     chosen revision of the draft; httplimit sends them as HTTP header fields, grpclimit as
//     gRPC metadata. Use it to send the fields from a server of your own.
//   - [github.com/strictrate/strictrate/loader] and [github.com/strictrate/strictrate/scripts]:
//     the engine's own (script handles on valkey-go's script cache, and the Lua sources). They
//     are not for callers: the scripts' keys, arguments and replies are the engine's business
//     and change with it.
//   - [github.com/strictrate/strictrate/cmd/strictrate]: the operator's command. "strictrate
//     inspect" shows what a key's log holds and the room each limit has left; "strictrate
//     reset" deletes a key's log.
//   - [github.com/strictrate/strictrate/bench]: the benchmark program (go run ./bench): Atomic
//     against Pipelined on one server, exactness, throughput, memory, leases.
//   - [github.com/strictrate/strictrate/examples/httpserver]: a small server limited by
//     httplimit, with its metrics on /metrics (cd examples && go run ./httpserver). The
//     examples are a module of their own, so that this module does not require the
//     Prometheus client and exporter they use.
//   - The packages under internal/ are the module's own: throwaway Valkey servers for the tests
//     and the benchmark (internal/valkeytest), the helpers the tests share
//     (internal/enginetest), and code the engine and the loader share (the nodes a client
//     knows, the contexts of their calls). They promise nothing across releases.
//
// # The calls most callers need
//
// Make one engine per valkey-go client with [engine.New], and share it: it is safe for
// concurrent use. New loads the scripts, so a server whose scripting is broken fails there and
// not on the first request. Then, per request:
//
//   - [engine.Engine.Allow] records one event for a key if an [engine.Limit] (Max events per
//     Window; [engine.PerSecond], [engine.PerMinute], [engine.PerHour]) admits it now. Its
//     [engine.Result] says whether it did (Allowed), the room left (Remaining) and, when
//     denied, the exact wait until the same request would be admitted (RetryAfter).
//   - [engine.Engine.AllowPolicy] does the same for several limits on one key, such as 5 per
//     second and 100 per hour ([engine.Policy]): a request is admitted only when every limit
//     has room, in one script call. Limits that share a key each hold on every event of the
//     key, so give a key all of its limits from its first request, in one Policy.
//   - For quotas over long periods, a limit's Resolution keeps its log to about Window/Resolution
//     entries (1,000,000 per 30 days at an hour: about 9 KB), never admitting more than Max,
//     and [engine.Calendar] counts a day, week, month or year in a time zone, in a counter;
//     both mix with other limits in a Policy.
//   - [engine.Engine.Wait] blocks until the key admits one event, as
//     golang.org/x/time/rate's Limiter.Wait does: for a client pacing its own calls, or a job.
//   - [engine.Engine.Refund] gives an admitted request's cost back (it failed before doing any
//     work, say); [engine.Engine.Settle] lowers it to what the request used: reserve the most
//     it can use with AllowN, then settle.
//   - [engine.Engine.Acquire] and [engine.Engine.Release] are in-flight limits: at most max
//     holders of a key at once, each holding a lease that expires unless extended
//     ([engine.Engine.Extend]), so a crashed holder's slot comes back by itself.
//
// A decision the server could not take is an error wrapping [engine.ErrUnavailable] and a
// Result that denies (fail-closed); bad input is [engine.ErrInvalidArgument], refused before
// anything is sent.
//
// For example, five login attempts per minute per user:
//
//	client, err := valkey.NewClient(valkey.ClientOption{InitAddress: []string{"127.0.0.1:6379"}})
//	if err != nil {
//		log.Fatal(err)
//	}
//	limiter, err := engine.New(client) // loads the scripts; fails here if scripting is broken
//	if err != nil {
//		log.Fatal(err)
//	}
//
//	res, err := limiter.Allow(ctx, "login:"+user, engine.PerMinute(5))
//	if err != nil {
//		return err // fail closed: the server could not decide
//	}
//	if !res.Allowed {
//		return fmt.Errorf("too many attempts, retry in %s", res.RetryAfter)
//	}
//
// # When to reach for the rest
//
//   - Weighted costs: [engine.Engine.AllowN] records n events at once, all or nothing, as one
//     entry of the log (a request that costs its bytes, its tokens, its rows).
//     [engine.Engine.WaitN] waits for n.
//   - Asking without recording: [engine.Engine.Peek] and [engine.Engine.PeekPolicy] return the
//     decision Allow or AllowPolicy would take, as a read-only script.
//   - The classic interface: [engine.Engine.Check], [engine.Engine.Record] and
//     [engine.Engine.Clear] implement the sliding-window-log article's [engine.Limiter], so
//     code written against it can switch over.
//   - Operators and tests: [engine.Engine.Inspect] reads a key's log as stored (what
//     cmd/strictrate prints), and [engine.Engine.Reset] deletes it.
//
// The options of [engine.New] change how decisions are taken; without them a decision is
// exact (Atomic mode), batched, on the server's clock, and fail-closed:
//
//   - [engine.WithBatching]: group commit, on by default: concurrent decisions bound for one
//     server share a script call, each decided exactly as alone. Turn it off only to measure
//     without it.
//   - [engine.WithDenyCache]: a key under abuse is refused from memory, without a round trip,
//     until its denial's RetryAfter has run.
//   - [engine.WithLocalQuota]: a hot key is admitted from small reservations this process
//     holds, without a call each and through a short outage, still never over Max in any
//     window.
//   - [engine.WithShadow]: try a new limit on live traffic. A request the limit denies is
//     admitted anyway, marked ShadowDenied, and the log records only what the limit admitted.
//   - [engine.WithFailOpen]: admit when the server cannot decide, where letting a request
//     through unlimited is cheaper than refusing it.
//   - [engine.WithReplicaAck] and [engine.WithDurableAck]: an admission waits until replicas
//     hold it (it survives a failover) or until it is fsynced (it survives a power loss).
//   - [engine.WithClock] (decide on the caller's clock instead of the server's),
//     [engine.WithPrefix], [engine.WithMeterProvider] (OpenTelemetry metrics) and
//     [engine.WithLogger].
//   - [engine.WithMode] chooses the [engine.Mode]: [engine.Atomic], the default, is exact;
//     [engine.Pipelined] is the common non-atomic design (ZREMRANGEBYSCORE, ZADD, ZCARD and
//     PEXPIRE in a pipeline), kept only to measure against: concurrent callers interleave, and
//     denied attempts stay in its log. It offers the article's operations on keys of its own;
//     what needs the atomic log is [engine.ErrUnsupported] there.
//
// A key the engine did not write (another type, another program's list, the other mode's log,
// a log a later release wrote) is refused with [engine.ErrUnknownLayout], never read as a
// count.
//
// The README and docs/ of the repository have the rest: limits that share a key, HTTP and
// gRPC, leases, production, operating, benchmarks and design.
package strictrate

import "github.com/strictrate/strictrate/engine"

// The import above lets the doc links of the package comment name package engine; this
// package declares nothing of its own.
var _ *engine.Engine
