package main

import (
	"context"
	"fmt"
	"time"

	"github.com/go-redis/redis_rate/v10"
	"github.com/redis/go-redis/v9"
	ulule "github.com/ulule/limiter/v3"
	ululeredis "github.com/ulule/limiter/v3/drivers/store/redis"
	"github.com/valkey-io/valkey-go"

	"github.com/strictrate/strictrate/engine"
	"github.com/strictrate/strictrate/pipelined"
)

// limiter is one rate limiter under test, reduced to what the comparison needs: allow takes
// one decision for key now, records the request when it is admitted, and reports whether it
// was.
type limiter interface {
	allow(ctx context.Context, key string) (bool, error)
}

// rate is the limit every limiter applies to each key: at most max requests per window.
type rate struct {
	max    int
	window time.Duration
}

// strictrateClients is how many valkey-go clients the strictrate rows spread their goroutines
// over: the main bench's -clients default (bench/main.go), which its throughput rows use.
const strictrateClients = 4

// contender is one row of the comparison: a limiter, the algorithm it runs, and how it
// connects.
type contender struct {
	// name is the row's name in the table and the JSON report.
	name string
	// algorithm is what the limiter computes, for the reader.
	algorithm string
	// connect builds the limiter against the server at addr, limiting each key to r, for
	// goroutines concurrent callers. It returns one limiter per client: the driver gives
	// goroutine g the limiter g % len; they share their counts (same server, same keys). close
	// releases the connections.
	connect func(ctx context.Context, addr string, r rate, goroutines int) (ls []limiter, close func(), err error)
	// clients says how connect connects, for the table.
	clients func(goroutines int) string
}

// batchedName is the row every other row's decisions/s is compared with.
const batchedName = "strictrate batched"

// contenders are the rows, in the order they run: strictrate's three ways first, then the
// peers.
var contenders = []contender{
	{
		name: batchedName, algorithm: "sliding-window log, one script, group commit",
		connect: connectStrictrate(false, engine.WithBatching(true)),
		clients: strictrateConns,
	},
	{
		name: "strictrate atomic", algorithm: "sliding-window log, one script per decision",
		connect: connectStrictrate(false, engine.WithBatching(false)),
		clients: strictrateConns,
	},
	{
		name: "strictrate pipelined", algorithm: "sliding-window sorted set, 4-command pipeline, not atomic",
		connect: connectStrictrate(true),
		clients: strictrateConns,
	},
	{
		name: "go-redis/redis_rate v10", algorithm: "GCRA, one script per decision",
		connect: connectRedisRate,
		clients: goRedisConns,
	},
	{
		name: "ulule/limiter v3", algorithm: "fixed window counter, one script per decision",
		connect: connectUlule,
		clients: goRedisConns,
	},
}

// strictrateConns describes the strictrate rows' connections.
func strictrateConns(int) string {
	return fmt.Sprintf("%d valkey-go clients (1 pipelined conn each)", strictrateClients)
}

// goRedisConns describes the peers' connections: one go-redis client whose pool has a
// connection per goroutine.
func goRedisConns(goroutines int) string {
	return fmt.Sprintf("1 go-redis client, PoolSize %d", goroutines)
}

// strictrateLimiter is one strictrate engine on its own valkey-go client: the exact engine, or
// the pipelined design (package pipelined).
type strictrateLimiter struct {
	e interface {
		Allow(ctx context.Context, key string, l engine.Limit) (engine.Result, error)
	}
	limit engine.Limit
}

// allow takes the engine's decision: a denial is a Result, not an error.
func (s strictrateLimiter) allow(ctx context.Context, key string) (bool, error) {
	r, err := s.e.Allow(ctx, key, s.limit)
	if err != nil {
		return false, fmt.Errorf("strictrate allow %s: %w", key, err)
	}
	return r.Allowed, nil
}

// connectStrictrate returns a contender's connect for strictrate engines made with opts (or,
// pipe, the pipelined design's): one
// valkey-go client and one engine per strictrateClients, as the main bench does. The servers
// here run without persistence on purpose, so the engine's persistence check is off.
func connectStrictrate(pipe bool, opts ...engine.Option) func(context.Context, string, rate, int) ([]limiter, func(), error) {
	return func(_ context.Context, addr string, r rate, _ int) ([]limiter, func(), error) {
		var clients []valkey.Client
		closeAll := func() {
			for _, c := range clients {
				c.Close()
			}
		}
		var ls []limiter
		for i := 0; i < strictrateClients; i++ {
			c, err := valkey.NewClient(valkey.ClientOption{InitAddress: []string{addr}})
			if err != nil {
				closeAll()
				return nil, nil, fmt.Errorf("valkey-go client for %s: %w", addr, err)
			}
			clients = append(clients, c)
			l := strictrateLimiter{limit: engine.Limit{Max: r.max, Window: r.window}}
			if pipe {
				l.e, err = pipelined.New(c)
			} else {
				l.e, err = engine.New(c, append([]engine.Option{engine.WithPersistenceCheck(engine.Ignore)}, opts...)...)
			}
			if err != nil {
				closeAll()
				return nil, nil, fmt.Errorf("strictrate engine: %w", err)
			}
			ls = append(ls, l)
		}
		return ls, closeAll, nil
	}
}

// newGoRedis connects the peers' go-redis client: a pool with a connection per goroutine, so
// that no goroutine waits for one (go-redis's default is 10 per GOMAXPROCS).
func newGoRedis(ctx context.Context, addr string, goroutines int) (*redis.Client, error) {
	rdb := redis.NewClient(&redis.Options{Addr: addr, PoolSize: goroutines})
	if err := rdb.Ping(ctx).Err(); err != nil {
		_ = rdb.Close()
		return nil, fmt.Errorf("go-redis client for %s: %w", addr, err)
	}
	return rdb, nil
}

// redisRateLimiter is go-redis/redis_rate: GCRA in one Lua script (EVALSHA, and EVAL when
// the server does not know it yet), on the server's clock.
type redisRateLimiter struct {
	l     *redis_rate.Limiter
	limit redis_rate.Limit
}

// allow admits the request when the GCRA admits its one event.
func (r redisRateLimiter) allow(ctx context.Context, key string) (bool, error) {
	res, err := r.l.Allow(ctx, key, r.limit)
	if err != nil {
		return false, fmt.Errorf("redis_rate allow %s: %w", key, err)
	}
	return res.Allowed > 0, nil
}

// connectRedisRate is redis_rate's connect: a burst of max, refilled at max per window, the
// library's own PerSecond shape for a one-second window.
func connectRedisRate(ctx context.Context, addr string, r rate, goroutines int) ([]limiter, func(), error) {
	rdb, err := newGoRedis(ctx, addr, goroutines)
	if err != nil {
		return nil, nil, err
	}
	l := redisRateLimiter{
		l:     redis_rate.NewLimiter(rdb),
		limit: redis_rate.Limit{Rate: r.max, Burst: r.max, Period: r.window},
	}
	return []limiter{l}, func() { _ = rdb.Close() }, nil
}

// ululeLimiter is ulule/limiter with its Redis store: INCRBY and PEXPIRE in one Lua script,
// a fixed window that starts at a key's first request.
type ululeLimiter struct {
	l *ulule.Limiter
}

// allow counts the request and admits it while the window's count is within the limit. The
// store counts denied requests too, as the library does.
func (u ululeLimiter) allow(ctx context.Context, key string) (bool, error) {
	c, err := u.l.Get(ctx, key)
	if err != nil {
		return false, fmt.Errorf("ulule/limiter get %s: %w", key, err)
	}
	return !c.Reached, nil
}

// connectUlule is ulule/limiter's connect. Making the store loads its scripts.
func connectUlule(ctx context.Context, addr string, r rate, goroutines int) ([]limiter, func(), error) {
	rdb, err := newGoRedis(ctx, addr, goroutines)
	if err != nil {
		return nil, nil, err
	}
	store, err := ululeredis.NewStoreWithOptions(rdb, ulule.StoreOptions{Prefix: ulule.DefaultPrefix})
	if err != nil {
		_ = rdb.Close()
		return nil, nil, fmt.Errorf("ulule/limiter redis store: %w", err)
	}
	l := ululeLimiter{l: ulule.New(store, ulule.Rate{Period: r.window, Limit: int64(r.max)})}
	return []limiter{l}, func() { _ = rdb.Close() }, nil
}
