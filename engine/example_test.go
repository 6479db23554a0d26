package engine_test

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/google/uuid"
	"github.com/valkey-io/valkey-go"

	"github.com/strictrate/strictrate/engine"
)

// The examples connect to Valkey as a program would, each with a client of its own: at the
// address in VALKEY_ADDR (which examples/httpserver reads too), else 127.0.0.1:6379. TestMain
// sets VALKEY_ADDR to the tests' own server (valkeytest starts a throwaway one unless
// VALKEY_ADDR already names a server), so that the examples run and their Output is checked.
// Each example keys its counts by a UUID, so its output is the same on every run, whatever
// the server holds.

func ExampleEngine_Allow() {
	// Valkey at $VALKEY_ADDR, else on this host's default port.
	client, err := valkey.NewClient(valkey.ClientOption{
		InitAddress: []string{cmp.Or(os.Getenv("VALKEY_ADDR"), "127.0.0.1:6379")},
	})
	if err != nil {
		panic(err)
	}
	defer client.Close()
	// A fixed clock makes the numbers below exact; by default the engine uses the server's.
	noon := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	e, err := engine.New(client, engine.WithClock(func() time.Time { return noon }))
	if err != nil {
		panic(err)
	}
	// A key of its own (a program would key by client), so the output is the same every run.
	key, limit := "example:allow:"+uuid.NewString(), engine.PerSecond(2)
	for i := 0; i < 3; i++ {
		r, err := e.Allow(context.Background(), key, limit)
		if err != nil {
			panic(err)
		}
		fmt.Printf("allowed=%v remaining=%d retry after=%s\n", r.Allowed, r.Remaining, r.RetryAfter)
	}
	// Output:
	// allowed=true remaining=1 retry after=0s
	// allowed=true remaining=0 retry after=0s
	// allowed=false remaining=0 retry after=1s
}

func ExampleEngine_AllowN() {
	// Valkey at $VALKEY_ADDR, else on this host's default port.
	client, err := valkey.NewClient(valkey.ClientOption{
		InitAddress: []string{cmp.Or(os.Getenv("VALKEY_ADDR"), "127.0.0.1:6379")},
	})
	if err != nil {
		panic(err)
	}
	defer client.Close()
	// A clock the example moves makes the numbers below exact; by default the engine uses
	// the server's clock.
	noon := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	now := noon
	e, err := engine.New(client, engine.WithClock(func() time.Time { return now }))
	if err != nil {
		panic(err)
	}
	key, limit := "example:allown:"+uuid.NewString(), engine.PerMinute(10)
	for _, n := range []int{6, 5, 4} { // all or nothing: 5 does not fit after 6, 4 does
		r, err := e.AllowN(context.Background(), key, limit, n)
		if err != nil {
			panic(err)
		}
		fmt.Printf("n=%d allowed=%v remaining=%d\n", n, r.Allowed, r.Remaining)
		now = now.Add(15 * time.Second)
	}
	// Output:
	// n=6 allowed=true remaining=4
	// n=5 allowed=false remaining=4
	// n=4 allowed=true remaining=0
}

func ExampleEngine_Peek() {
	// Valkey at $VALKEY_ADDR, else on this host's default port.
	client, err := valkey.NewClient(valkey.ClientOption{
		InitAddress: []string{cmp.Or(os.Getenv("VALKEY_ADDR"), "127.0.0.1:6379")},
	})
	if err != nil {
		panic(err)
	}
	defer client.Close()
	// A fixed clock makes the numbers below exact; by default the engine uses the server's.
	noon := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	e, err := engine.New(client, engine.WithClock(func() time.Time { return noon }))
	if err != nil {
		panic(err)
	}
	ctx, key, limit := context.Background(), "example:peek:"+uuid.NewString(), engine.PerHour(3)
	if _, err := e.Allow(ctx, key, limit); err != nil {
		panic(err)
	}
	for i := 0; i < 2; i++ { // Peek records nothing: asking twice gives the same answer
		r, err := e.Peek(ctx, key, limit)
		if err != nil {
			panic(err)
		}
		fmt.Printf("would allow=%v remaining=%d reset after=%s\n", r.Allowed, r.Remaining, r.ResetAfter)
	}
	// Output:
	// would allow=true remaining=2 reset after=1h0m0s
	// would allow=true remaining=2 reset after=1h0m0s
}

func ExampleEngine_AllowPolicy() {
	// Valkey at $VALKEY_ADDR, else on this host's default port.
	client, err := valkey.NewClient(valkey.ClientOption{
		InitAddress: []string{cmp.Or(os.Getenv("VALKEY_ADDR"), "127.0.0.1:6379")},
	})
	if err != nil {
		panic(err)
	}
	defer client.Close()
	// A clock the example moves makes the numbers below exact; by default the engine uses
	// the server's clock.
	noon := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	now := noon
	e, err := engine.New(client, engine.WithClock(func() time.Time { return now }))
	if err != nil {
		panic(err)
	}
	// 2 per second and 3 per minute, decided together in one atomic call.
	p := engine.Policy{engine.PerSecond(2), engine.PerMinute(3)}
	key := "example:policy:" + uuid.NewString()
	for _, step := range []time.Duration{0, 0, 0, time.Second, 0} {
		now = now.Add(step)
		r, err := e.AllowPolicy(context.Background(), key, p, 1)
		if err != nil {
			panic(err)
		}
		fmt.Printf("+%s allowed=%v remaining=%d retry after=%s\n", now.Sub(noon), r.Allowed, r.Remaining, r.RetryAfter)
	}
	// Output:
	// +0s allowed=true remaining=1 retry after=0s
	// +0s allowed=true remaining=0 retry after=0s
	// +0s allowed=false remaining=0 retry after=1s
	// +1s allowed=true remaining=0 retry after=0s
	// +1s allowed=false remaining=0 retry after=59s
}

// An in-flight limit: at most two exports of one tenant run at once. Each holder releases its
// lease when done; a holder that dies frees its slot when its lease expires.
func ExampleEngine_Acquire() {
	// Valkey at $VALKEY_ADDR, else on this host's default port.
	client, err := valkey.NewClient(valkey.ClientOption{
		InitAddress: []string{cmp.Or(os.Getenv("VALKEY_ADDR"), "127.0.0.1:6379")},
	})
	if err != nil {
		panic(err)
	}
	defer client.Close()
	// A clock the example moves makes the numbers below exact; by default the engine uses
	// the server's clock.
	noon := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	now := noon
	e, err := engine.New(client, engine.WithClock(func() time.Time { return now }))
	if err != nil {
		panic(err)
	}
	ctx, key := context.Background(), "example:exports:"+uuid.NewString()

	a, err := e.Acquire(ctx, key, 2, 30*time.Second)
	if err != nil {
		panic(err)
	}
	fmt.Println("first: remaining", a.Remaining)
	b, err := e.Acquire(ctx, key, 2, 30*time.Second)
	if err != nil {
		panic(err)
	}
	fmt.Println("second: remaining", b.Remaining)

	now = noon.Add(10 * time.Second)
	_, err = e.Acquire(ctx, key, 2, 30*time.Second)
	var denied *engine.LeaseDeniedError
	if errors.As(err, &denied) {
		fmt.Println("third: denied, retry after", denied.RetryAfter())
	}

	// A long holder extends its lease before it expires; an expired one cannot be extended.
	now = noon.Add(25 * time.Second)
	if a, err = e.Extend(ctx, a, 30*time.Second); err != nil {
		panic(err)
	}
	fmt.Println("first extended until", a.Expires.UTC().Format(time.TimeOnly))
	now = noon.Add(31 * time.Second)
	_, err = e.Extend(ctx, b, 30*time.Second)
	fmt.Println("second extended after its expiry:", errors.Is(err, engine.ErrLeaseExpired))

	if err := e.Release(ctx, a); err != nil {
		panic(err)
	}
	if err := e.Release(ctx, a); err != nil { // again: a no-op
		panic(err)
	}
	// Output:
	// first: remaining 1
	// second: remaining 0
	// third: denied, retry after 20s
	// first extended until 12:00:55
	// second extended after its expiry: true
}
