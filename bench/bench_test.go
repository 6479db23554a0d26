package main

import (
	"context"
	"math/rand/v2"
	"runtime"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/valkey-io/valkey-go"

	"github.com/strictrate/strictrate/engine"
	"github.com/strictrate/strictrate/internal/valkeytest"
	"github.com/strictrate/strictrate/pipelined"
)

// benchGoroutines is the request concurrency of every benchmark here, as in `go run ./bench`:
// RunParallel starts GOMAXPROCS × parallelism goroutines.
const benchGoroutines = 64

const benchClients = 4

// BenchmarkAllow measures Allow in both modes, atomic with and without batching and with local
// quota (WithLocalQuota), on one hot key (far more requests than the
// limit) and on 10,000 keys (a limit that admits nearly all). Custom metrics: decisions/s and,
// for the hot key, admitted/limit: admitted events over what the limit allows in the time
// run (1 is exact; below 1, false denials).
func BenchmarkAllow(b *testing.B) {
	srv := valkeytest.New(b)
	clients := make([]valkey.Client, benchClients)
	for i := range clients {
		clients[i] = srv.Client(b)
	}
	prefix := "strictrate-gobench:" + uuid.NewString()[:8] + ":"
	for _, v := range []struct {
		name      string
		opts      []engine.Option
		pipelined bool
	}{
		{"atomic", unbatched, false},
		{"batched", batched, false},
		{"localquota", []engine.Option{engine.WithBatching(true), engine.WithLocalQuota(engine.LocalQuota{})}, false},
		{"pipelined", nil, true},
	} {
		var es []decider
		for _, c := range clients {
			var e decider
			var err error
			if v.pipelined {
				e, err = pipelined.New(c, pipelined.WithPrefix(prefix))
			} else {
				e, err = engine.New(c, append([]engine.Option{engine.WithPrefix(prefix)}, v.opts...)...)
			}
			if err != nil {
				b.Fatal(err)
			}
			es = append(es, e)
		}
		b.Run(v.name+"/hotkey", func(b *testing.B) {
			benchHotKey(b, es, "hot:"+v.name+":"+strconv.Itoa(b.N))
		})
		b.Run(v.name+"/manykeys", func(b *testing.B) {
			benchManyKeys(b, es, v.name)
		})
	}
}

func benchHotKey(b *testing.B, es []decider, key string) {
	limit := engine.Limit{Max: 100, Window: 100 * time.Millisecond}
	var admitted, next atomic.Int64
	b.ReportAllocs()
	b.SetParallelism(parallelism())
	b.ResetTimer()
	start := time.Now()
	b.RunParallel(func(pb *testing.PB) {
		e := es[int(next.Add(1))%len(es)]
		ctx := context.Background()
		for pb.Next() {
			r, err := e.Allow(ctx, key, limit)
			if err != nil {
				b.Error(err)
				return
			}
			if r.Allowed {
				admitted.Add(1)
			}
		}
	})
	elapsed := time.Since(start)
	b.StopTimer()
	// From the first admission, the limit allows Max events per window begun.
	allowed := float64(limit.Max) * float64(elapsed/limit.Window+1)
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "decisions/s")
	b.ReportMetric(float64(admitted.Load())/allowed, "admitted/limit")
}

func benchManyKeys(b *testing.B, es []decider, name string) {
	limit := engine.Limit{Max: 100, Window: time.Second}
	runOnRandomKeys(b, manyKeys("many:"+name), func(ctx context.Context, g int, key string) error {
		_, err := es[g%len(es)].Allow(ctx, key, limit)
		return err
	})
}

// runOnRandomKeys runs op from benchGoroutines goroutines, each on keys picked at random, and
// reports decisions/s. op gets the goroutine's number, to pick its client, and the key.
func runOnRandomKeys(b *testing.B, keys []string, op func(ctx context.Context, g int, key string) error) {
	var next atomic.Int64
	b.ReportAllocs()
	b.SetParallelism(parallelism())
	b.ResetTimer()
	start := time.Now()
	b.RunParallel(func(pb *testing.PB) {
		g := int(next.Add(1))
		rng := rand.New(rand.NewPCG(uint64(g), 7))
		ctx := context.Background()
		for pb.Next() {
			if err := op(ctx, g, keys[rng.IntN(len(keys))]); err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "decisions/s")
}

// BenchmarkBareEvalsha is the floor: valkey-go sending the same script with EVALSHA and
// reading its reply array, with no engine around it. Compare allocs/op with BenchmarkAllow.
func BenchmarkBareEvalsha(b *testing.B) {
	srv := valkeytest.New(b)
	var clients []valkey.Client
	for i := 0; i < benchClients; i++ {
		clients = append(clients, srv.Client(b))
	}
	// engine.New loads the script, so EVALSHA finds it.
	if _, err := engine.New(clients[0]); err != nil {
		b.Fatal(err)
	}
	sha := decideSHA1()
	// The argument as the engine sends it (scripts/decide.lua): one string of 8-byte integers,
	// the server's clock, n, then the limit's window in µs and max.
	keys := manyKeys("strictrate-gobench:" + uuid.NewString()[:8] + ":bare")
	arg := singleArg(time.Second.Microseconds(), 100)
	runOnRandomKeys(b, keys, func(ctx context.Context, g int, key string) error {
		c := clients[g%len(clients)]
		_, err := c.Do(ctx, c.B().Evalsha().Sha1(sha).Numkeys(1).Key(key).Arg(arg).Build()).ToString()
		return err
	})
}

func manyKeys(prefix string) []string {
	keys := make([]string, 10_000)
	for i := range keys {
		keys[i] = prefix + ":" + strconv.Itoa(i)
	}
	return keys
}

// parallelism makes RunParallel start benchGoroutines goroutines in all: RunParallel
// multiplies it by GOMAXPROCS.
func parallelism() int {
	return max(1, benchGoroutines/runtime.GOMAXPROCS(0))
}
