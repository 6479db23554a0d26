package engine_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/valkey-io/valkey-go"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/strictrate/strictrate/engine"
	"github.com/strictrate/strictrate/internal/enginetest"
	"github.com/strictrate/strictrate/internal/valkeytest"
)

// 64 goroutines over 4 clients take slots of one key, max 5 at once: the holders counted on
// this side never exceed 5, everyone gets through, and every slot is given back.
func TestLeaseHoldersNeverExceedMax(t *testing.T) {
	es, c := enginetest.Engines(t, exampleServer, 4)
	key, max := enginetest.NewKey(t), 5
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	a := auditHolders(t, ctx, es, key, max, 64, 2)
	t.Logf("holders at once: at most %d of %d; %d denials on the way", a.peak, max, a.denials)
	if a.peak > int64(max) {
		t.Fatalf("%d holders at once, above max %d", a.peak, max)
	}
	enginetest.Want(t, "goroutines through every round", a.through, int64(64))
	if a.denials == 0 {
		t.Fatal("no acquire was ever denied: the key was never full, so nothing was tested")
	}
	enginetest.Want(t, "leases left after every release", leaseCount(t, c, key), int64(0))
}

// Denied: RetryAfter is the wait until the soonest lease expires, ResetAfter until the last
// one does, exact to the microsecond on the clock that decided; the key lives as long as its
// last lease and no longer.
func TestLeaseDenialRetriesAtTheSoonestExpiry(t *testing.T) {
	c := exampleServer.Client(t)
	e, clock := enginetest.Clocked(t, c)
	key := enginetest.NewKey(t)
	// Seconds on the caller's clock: the key's expiry runs on the server's, and must not pass
	// while the test runs.
	a := mustAcquire(t, e, key, 2, 10*time.Second)
	enginetest.Want(t, "first lease: remaining", a.Remaining, 1)
	wantTime(t, "first lease: At", a.At, enginetest.T0)
	wantTime(t, "first lease: Expires", a.Expires, enginetest.T0.Add(10*time.Second))
	clock.Set(enginetest.T0.Add(3 * time.Second))
	b := mustAcquire(t, e, key, 2, 20*time.Second)
	enginetest.Want(t, "second lease: remaining", b.Remaining, 0)
	if b.ID == a.ID {
		t.Fatalf("two leases share the id %s, want an id each", a.ID)
	}
	// On a caller's clock the key's expiry is relative, with 2 ms more for the server's
	// millisecond (lib_lease.lua).
	if ttl := enginetest.PTTL(t, c, leaseKey(key)); ttl <= 10_000 || ttl > 20_002 {
		t.Fatalf("lease key PTTL %d ms, want the longest lease's 20 s and 2 ms (less the time passed)", ttl)
	}
	clock.Set(enginetest.T0.Add(5 * time.Second))
	r := mustDeny(t, e, key, 2, time.Second)
	wantTime(t, "denied: At", r.At, enginetest.T0.Add(5*time.Second))
	enginetest.Want(t, "denied: RetryAfter (until a expires)", r.RetryAfter, 5*time.Second)
	enginetest.Want(t, "denied: ResetAfter (until b expires)", r.ResetAfter, 18*time.Second)
	enginetest.Want(t, "a denial adds no lease", leaseCount(t, c, key), int64(2))

	// A larger max on the same key has room: max is the caller's, per call.
	mustAcquire(t, e, key, 3, time.Millisecond)
	// At a's expiry its slot is free again, not a microsecond before.
	clock.Set(enginetest.T0.Add(10*time.Second - time.Microsecond))
	enginetest.Want(t, "1µs before a expires: RetryAfter", mustDeny(t, e, key, 2, time.Second).RetryAfter, time.Microsecond)
	clock.Set(enginetest.T0.Add(10 * time.Second))
	mustAcquire(t, e, key, 2, time.Second)
}

func wantTime(t *testing.T, what string, got, wantT time.Time) {
	t.Helper()
	if !got.Equal(wantT) {
		t.Fatalf("%s = %s, want %s", what, got, wantT)
	}
}

// Extend keeps a long holder's slot past its first ttl; a lease that expired, even by a
// microsecond and not dropped yet, cannot be extended, and the error says so.
func TestLeaseExtendKeepsOnlyAHeldLease(t *testing.T) {
	c := exampleServer.Client(t)
	e, clock := enginetest.Clocked(t, c)
	ctx, key, ttl := context.Background(), enginetest.NewKey(t), 10*time.Second
	a := mustAcquire(t, e, key, 1, ttl)

	clock.Set(enginetest.T0.Add(8 * time.Second))
	a, err := e.Extend(ctx, a, ttl)
	if err != nil {
		t.Fatalf("Extend a held lease: %v", err)
	}
	wantTime(t, "extended: At", a.At, enginetest.T0.Add(8*time.Second))
	wantTime(t, "extended: Expires", a.Expires, enginetest.T0.Add(18*time.Second))
	clock.Set(enginetest.T0.Add(15 * time.Second)) // past the first ttl: still held
	enginetest.Want(t, "past the first ttl: RetryAfter", mustDeny(t, e, key, 1, ttl).RetryAfter, 3*time.Second)

	clock.Set(enginetest.T0.Add(18 * time.Second)) // the extended lease expires now
	if _, err := e.Extend(ctx, a, ttl); !errors.Is(err, engine.ErrLeaseExpired) {
		t.Fatalf("Extend at the lease's expiry: %v, want ErrLeaseExpired", err)
	}
	enginetest.Want(t, "the expired lease is dropped", leaseCount(t, c, key), int64(0))
	b := mustAcquire(t, e, key, 1, ttl)
	_, err = e.Extend(ctx, a, ttl)
	if !errors.Is(err, engine.ErrLeaseExpired) || !strings.Contains(err.Error(), a.ID.String()) {
		t.Fatalf("Extend after another took the slot: %v, want ErrLeaseExpired naming the lease", err)
	}
	mustDeny(t, e, key, 1, ttl) // b keeps its slot
	mustRelease(t, e, b)
	if _, err := e.Extend(ctx, b, ttl); !errors.Is(err, engine.ErrLeaseExpired) {
		t.Fatalf("Extend a released lease: %v, want ErrLeaseExpired", err)
	}

	// On the server's clock: the lease moves to ttl from the server's now.
	srv := enginetest.New(t, c)
	key = enginetest.NewKey(t)
	l := mustAcquire(t, srv, key, 1, 200*time.Millisecond)
	l, err = srv.Extend(ctx, l, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if l.Expires.Sub(l.At) != time.Minute || time.Since(l.At).Abs() > time.Minute {
		t.Fatalf("extended on the server's clock: At %s, Expires %s; want Expires a minute after At, At about now", l.At, l.Expires)
	}
	if ttl := enginetest.PTTL(t, c, leaseKey(key)); ttl < 50_000 {
		t.Fatalf("lease key PTTL %d ms after extending to a minute, want at least 50000", ttl)
	}
}

// Release is idempotent, a no-op once the lease expired, and never frees another holder's
// slot: not when released twice, not when its slot was taken again after it expired.
func TestLeaseReleaseNeverFreesAnotherHoldersSlot(t *testing.T) {
	c := exampleServer.Client(t)
	e, clock := enginetest.Clocked(t, c)
	key, ttl := enginetest.NewKey(t), 10*time.Second

	a := mustAcquire(t, e, key, 2, ttl)
	mustAcquire(t, e, key, 2, ttl) // b
	mustRelease(t, e, a)
	mustRelease(t, e, a)
	mustAcquire(t, e, key, 2, ttl) // c: a's slot
	mustDeny(t, e, key, 2, ttl)    // b and c hold: the second release freed nothing
	enginetest.Want(t, "leases after a double release", leaseCount(t, c, key), int64(2))

	key = enginetest.NewKey(t)
	a = mustAcquire(t, e, key, 1, ttl)
	clock.Set(enginetest.T0.Add(ttl))
	b := mustAcquire(t, e, key, 1, ttl) // a expired: its slot is b's
	mustRelease(t, e, a)
	enginetest.Want(t, "after releasing the expired lease: b still holds, RetryAfter", mustDeny(t, e, key, 1, ttl).RetryAfter, ttl)
	mustRelease(t, e, b)
	mustAcquire(t, e, key, 1, ttl)

	// Expired and not dropped yet: the release takes it out, and frees nothing else.
	key = enginetest.NewKey(t)
	a = mustAcquire(t, e, key, 1, ttl)
	clock.Set(enginetest.T0.Add(3 * ttl))
	mustRelease(t, e, a)
	enginetest.Want(t, "leases after releasing an expired one", leaseCount(t, c, key), int64(0))
	if n := valkeytest.Must(t, "EXISTS", c.Do(context.Background(), c.B().Exists().Key(leaseKey(key)).Build()), valkey.ValkeyResult.AsInt64); n != 0 {
		t.Fatalf("the lease key exists after its last lease was released, want it gone")
	}
}

// A key's leases and its rate-limit log are two keys: using both on one key changes neither.
// Leases run on the server's clock.
func TestLeaseKeysApartFromRateLimitLogs(t *testing.T) {
	c := exampleServer.Client(t)
	ctx := context.Background()
	e := enginetest.New(t, c)
	key := enginetest.NewKey(t)
	enginetest.MustAllowN(t, e, key, engine.PerMinute(2), 2)
	before := time.Now()
	l := mustAcquire(t, e, key, 1, time.Minute)
	if l.At.Sub(before).Abs() > time.Minute {
		t.Fatalf("lease At %s, not the server's clock", l.At)
	}
	enginetest.Want(t, "rate limit still full", enginetest.MustAllowN(t, e, key, engine.PerMinute(2), 1).Allowed, false)
	for full, kind := range map[string]string{enginetest.Prefix + key: "list", leaseKey(key): "zset"} {
		got := valkeytest.Must(t, "TYPE", c.Do(ctx, c.B().Type().Key(full).Build()), valkey.ValkeyResult.ToString)
		enginetest.Want(t, "TYPE "+full, got, kind)
	}
	mustRelease(t, e, l)
	enginetest.Want(t, "events in the log after the release", enginetest.StoredEvents(t, c, key), int64(2))
}

// Every invalid input is refused with ErrInvalidArgument before anything is sent: the lease
// set keeps its leases and its expiry, or stays absent.
func TestLeaseInvalidArgumentsChangeNothing(t *testing.T) {
	c := exampleServer.Client(t)
	ctx := context.Background()
	e := enginetest.New(t, c)
	zero := enginetest.New(t, c, engine.WithClock(func() time.Time { return time.Time{} }))
	held := func(key string) engine.Lease { return engine.Lease{Key: key, ID: uuid.New()} }
	calls := []struct {
		name string
		call func(key string) error
	}{
		{"Acquire empty key", func(string) error { _, err := e.Acquire(ctx, "", 1, time.Second); return err }},
		{"Acquire max 0", func(k string) error { _, err := e.Acquire(ctx, k, 0, time.Second); return err }},
		{"Acquire max -1", func(k string) error { _, err := e.Acquire(ctx, k, -1, time.Second); return err }},
		{"Acquire max above MaxEvents", func(k string) error {
			_, err := e.Acquire(ctx, k, engine.MaxEvents+1, time.Second)
			return err
		}},
		{"Acquire ttl 0", func(k string) error { _, err := e.Acquire(ctx, k, 3, 0); return err }},
		{"Acquire ttl 999µs", func(k string) error { _, err := e.Acquire(ctx, k, 3, 999*time.Microsecond); return err }},
		{"Acquire ttl negative", func(k string) error { _, err := e.Acquire(ctx, k, 3, -time.Second); return err }},
		{"Acquire ttl above MaxLeaseTTL", func(k string) error {
			_, err := e.Acquire(ctx, k, 3, engine.MaxLeaseTTL+time.Microsecond)
			return err
		}},
		{"Acquire on a zero clock", func(k string) error { _, err := zero.Acquire(ctx, k, 3, time.Second); return err }},
		{"Extend zero lease", func(string) error { _, err := e.Extend(ctx, engine.Lease{}, time.Second); return err }},
		{"Extend lease without id", func(k string) error {
			_, err := e.Extend(ctx, engine.Lease{Key: k}, time.Second)
			return err
		}},
		{"Extend ttl 999µs", func(k string) error { _, err := e.Extend(ctx, held(k), 999*time.Microsecond); return err }},
		{"Extend on a zero clock", func(k string) error { _, err := zero.Extend(ctx, held(k), time.Second); return err }},
		{"Release lease without key", func(string) error { return e.Release(ctx, engine.Lease{ID: uuid.New()}) }},
	}
	for _, existing := range []bool{false, true} {
		for _, tc := range calls {
			t.Run(fmt.Sprintf("%s/existing=%v", tc.name, existing), func(t *testing.T) {
				key := enginetest.NewKey(t)
				var before []string
				if existing {
					mustAcquire(t, e, key, 3, time.Minute)
					before = valkeytest.Must(t, "ZRANGE", c.Do(ctx, c.B().Zrange().Key(leaseKey(key)).Min("0").Max("-1").Withscores().Build()), valkey.ValkeyResult.AsStrSlice)
				}
				if err := tc.call(key); !errors.Is(err, engine.ErrInvalidArgument) {
					t.Fatalf("err = %v, want ErrInvalidArgument", err)
				}
				after := valkeytest.Must(t, "ZRANGE", c.Do(ctx, c.B().Zrange().Key(leaseKey(key)).Min("0").Max("-1").Withscores().Build()), valkey.ValkeyResult.AsStrSlice)
				if fmt.Sprint(after) != fmt.Sprint(before) {
					t.Fatalf("leases changed from %v to %v, want them unchanged", before, after)
				}
				// A minute, rounded up to the millisecond on the server's clock.
				if ttl := enginetest.PTTL(t, c, leaseKey(key)); existing && (ttl <= 0 || ttl > 60_001) || !existing && ttl != -2 {
					t.Fatalf("PTTL %d after a refused call, want the minute set before (0 to 60001) or -2 (no key)", ttl)
				}
			})
		}
	}
	// A lease fail-open granted holds no slot: releasing it sends nothing and succeeds.
	if err := e.Release(ctx, engine.Lease{Key: enginetest.NewKey(t)}); err != nil {
		t.Fatalf("Release of a lease without id: %v", err)
	}
}

// leaseChildEnv, when set, makes TestLeaseHolderKilled the child: it holds a lease and waits
// to be killed. Its value is the key and the ttl.
const leaseChildEnv = "STRICTRATE_TEST_LEASE_CHILD"

// A process that holds a lease and is killed with SIGKILL never releases it: its slot stays
// taken until the lease's expiry and frees then, not before and not after, on the server's
// clock. The child is this test binary run again, holding a lease of the parent's key.
func TestLeaseHolderKilled(t *testing.T) {
	if spec := os.Getenv(leaseChildEnv); spec != "" {
		holdLeaseUntilKilled(t, spec)
		return
	}
	valkeytest.SkipIfShort(t, "starts an OS process and kills it")
	c := exampleServer.Client(t)
	e := enginetest.New(t, c)
	ctx := context.Background()
	key, ttl := enginetest.NewKey(t), 1500*time.Millisecond

	child := startChild(t, "TestLeaseHolderKilled", leaseChildEnv+"="+key+" "+ttl.String())
	exited := make(chan error, 1)
	lines := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(child.Stdout)
		for sc.Scan() {
			if line, ok := strings.CutPrefix(sc.Text(), "lease-held "); ok {
				lines <- line
			}
		}
		exited <- child.Wait() // after the pipe is drained, as Wait requires
	}()
	killed := false
	t.Cleanup(func() {
		if !killed {
			_ = child.Kill()
			<-exited
		}
	})

	var line string
	select {
	case line = <-lines:
	case err := <-exited:
		killed = true
		t.Fatalf("the child exited before holding a lease: %v", err)
	case <-time.After(time.Minute):
		t.Fatalf("the child did not hold a lease within a minute")
	}
	var idText string
	var expiresUs int64
	if _, err := fmt.Sscanf(line, "%s %d", &idText, &expiresUs); err != nil {
		t.Fatalf("child said %q: %v", line, err)
	}
	id := uuid.MustParse(idText)
	expires := time.UnixMicro(expiresUs)

	if err := child.Kill(); err != nil { // SIGKILL: no defer, no release runs
		t.Fatal(err)
	}
	killed = true
	if err := <-exited; err == nil || !strings.HasPrefix(err.Error(), "signal: killed") {
		t.Fatalf("child ended with %v, want killed by SIGKILL", err)
	}
	score := valkeytest.Must(t, "ZSCORE", c.Do(ctx, c.B().Zscore().Key(leaseKey(key)).Member(string(id[:])).Build()), valkey.ValkeyResult.AsFloat64)
	if int64(score) != expiresUs {
		t.Fatalf("the dead child's lease is stored to expire at %d µs, want the %d it said", int64(score), expiresUs)
	}
	// The key goes away with the lease: its expiry is the lease's, rounded up to a millisecond.
	expireAt := valkeytest.Must(t, "PEXPIRETIME", c.Do(ctx, c.B().Pexpiretime().Key(leaseKey(key)).Build()), valkey.ValkeyResult.AsInt64)
	if expireAt != (expiresUs+999)/1000 {
		t.Fatalf("lease key expires at %d ms, want the lease's expiry %d µs rounded up", expireAt, expiresUs)
	}

	// Try for the slot until granted, more often as the expiry nears. Each denial is decided
	// on the server's clock: it must come before the dead lease's expiry and name the wait
	// until it, to the microsecond; the grant must come at or after it.
	denials := 0
	for {
		l, err := e.Acquire(ctx, key, 1, ttl)
		var denied *engine.LeaseDeniedError
		if errors.As(err, &denied) {
			r := engine.Result{At: denied.At, RetryAfter: denied.RetryAfter()}
			if !r.At.Before(expires) || r.RetryAfter != expires.Sub(r.At) {
				t.Fatalf("denied at %s with RetryAfter %s; want a denial before the dead lease's expiry at %s, retrying at it", r.At.Format(time.StampMicro), r.RetryAfter, expires.Format(time.StampMicro))
			}
			denials++
			// Halve the wait down to the last few milliseconds, then try densely: a slot
			// freed early would be granted before the expiry.
			pause := r.RetryAfter / 2
			if r.RetryAfter <= 4*time.Millisecond {
				pause = 200 * time.Microsecond
			}
			time.Sleep(pause)
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		if l.At.Before(expires) {
			t.Fatalf("granted at %s, want no grant before the dead lease expired at %s", l.At.Format(time.StampMicro), expires.Format(time.StampMicro))
		}
		if denials == 0 {
			t.Fatalf("granted at the first try, %s after the lease's expiry: the child's lease ran out before it was killed (ttl %s too short for this machine)", l.At.Sub(expires), ttl)
		}
		t.Logf("slot held by the killed child: %d denials, then granted %s after its lease's expiry (server clock)", denials, l.At.Sub(expires))
		mustRelease(t, e, l)
		return
	}
}

// holdLeaseUntilKilled is the child's side of TestLeaseHolderKilled: acquire, say so on
// stdout, and wait, never releasing. It exits on its own after a minute, should its parent
// be gone.
func holdLeaseUntilKilled(t *testing.T, spec string) {
	key, ttlText, _ := strings.Cut(spec, " ")
	ttl, err := time.ParseDuration(ttlText)
	if err != nil {
		t.Fatal(err)
	}
	e := enginetest.New(t, exampleServer.Client(t))
	l := mustAcquire(t, e, key, 1, ttl)
	fmt.Printf("lease-held %s %d\n", l.ID, l.Expires.UnixMicro())
	os.Stdout.Sync()
	time.Sleep(time.Minute)
	t.Fatal("the parent never killed this child")
}

// The server down: fail-closed Acquire and Extend return ErrUnavailable; fail-open grants a
// lease that holds no slot and says why; Release returns the error either way, and a
// cancelled caller is an error either way.
func TestLeaseFailOpenAndFailClosed(t *testing.T) {
	own := valkeytest.New(t, valkeytest.OwnServer())
	c := own.Client(t)
	closed := enginetest.New(t, c)
	open := enginetest.New(t, c, engine.WithFailOpen(true))
	key, ttl := enginetest.NewKey(t), time.Minute
	l := mustAcquire(t, open, key, 2, ttl)
	if err := own.Stop(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()

	if got, err := closed.Acquire(ctx, key, 2, ttl); !errors.Is(err, engine.ErrUnavailable) || got != (engine.Lease{}) {
		t.Fatalf("fail-closed Acquire, server down: %+v, %v; want no lease and ErrUnavailable", got, err)
	}
	if _, err := closed.Extend(ctx, l, ttl); !errors.Is(err, engine.ErrUnavailable) || errors.Is(err, engine.ErrLeaseExpired) {
		t.Fatalf("fail-closed Extend, server down: %v; want ErrUnavailable", err)
	}
	before := time.Now()
	got, err := open.Acquire(ctx, key, 2, ttl)
	if err != nil || !errors.Is(got.BackendErr, engine.ErrUnavailable) || got.ID != uuid.Nil || got.Key != key ||
		got.At.Before(before) || got.Expires != got.At.Add(ttl) {
		t.Fatalf("fail-open Acquire, server down: %+v, %v; want a lease without id, carrying ErrUnavailable", got, err)
	}
	if err := open.Release(ctx, got); err != nil {
		t.Fatalf("Release of a fail-open lease: %v, want nil (it holds no slot)", err)
	}
	ext, err := open.Extend(ctx, l, ttl)
	if err != nil || !errors.Is(ext.BackendErr, engine.ErrUnavailable) || ext.Expires != ext.At.Add(ttl) {
		t.Fatalf("fail-open Extend, server down: %+v, %v; want the lease carrying ErrUnavailable", ext, err)
	}
	for name, e := range map[string]*engine.Engine{"closed": closed, "open": open} {
		if err := e.Release(ctx, l); !errors.Is(err, engine.ErrUnavailable) {
			t.Fatalf("%s Release, server down: %v; want ErrUnavailable", name, err)
		}
	}
	cancelled, cancelNow := context.WithCancel(context.Background())
	cancelNow()
	if _, err := open.Acquire(cancelled, key, 2, ttl); !errors.Is(err, context.Canceled) {
		t.Fatalf("fail-open Acquire with a cancelled context: %v; want context.Canceled", err)
	}
}

// A denied Acquire says what a holder-to-be needs: a *LeaseDeniedError (matching
// ErrRateLimitExceeded) with the holders, the key's max, and when the first and the last held
// lease expire.
func TestLeaseDenialSaysWhoHoldsAndUntilWhen(t *testing.T) {
	c := exampleServer.Client(t)
	ctx := context.Background()
	e, clock := enginetest.Clocked(t, c)
	key := enginetest.NewKey(t)
	first, err := e.Acquire(ctx, key, 2, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	clock.Set(enginetest.T0.Add(time.Second))
	last, err := e.Acquire(ctx, key, 2, 20*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	clock.Set(enginetest.T0.Add(4 * time.Second))
	_, err = e.Acquire(ctx, key, 2, time.Second)
	var denied *engine.LeaseDeniedError
	if !errors.As(err, &denied) || !errors.Is(err, engine.ErrRateLimitExceeded) {
		t.Fatalf("Acquire of a full key: %v, want a *LeaseDeniedError matching ErrRateLimitExceeded", err)
	}
	want := engine.LeaseDeniedError{Key: key, Max: 2, Holders: 2, At: enginetest.T0.Add(4 * time.Second),
		NextExpiry: first.Expires, LastExpiry: last.Expires}
	if denied.Key != want.Key || denied.Max != want.Max || denied.Holders != want.Holders || !denied.At.Equal(want.At) ||
		!denied.NextExpiry.Equal(want.NextExpiry) || !denied.LastExpiry.Equal(want.LastExpiry) {
		t.Fatalf("denial %+v, want %+v", *denied, want)
	}
	enginetest.Want(t, "RetryAfter", denied.RetryAfter(), 6*time.Second)
}

// The leases of a key are a sorted set: a lease key that holds anything else is refused by
// Acquire, Extend and Release with ErrUnknownLayout, and left as it was.
func TestLeaseKeyOfAnotherTypeIsRefused(t *testing.T) {
	c := exampleServer.Client(t)
	ctx := context.Background()
	e := enginetest.New(t, c, engine.WithFailOpen(true))
	key := enginetest.NewKey(t)
	full := enginetest.Prefix + engine.LeaseNamespace + key
	if err := c.Do(ctx, c.B().Set().Key(full).Value("not leases").Build()).Error(); err != nil {
		t.Fatal(err)
	}
	before := stateOf(t, c, full)
	lease := engine.Lease{Key: key, ID: uuid.New()}
	for name, call := range map[string]func() error{
		"Acquire": func() error { _, err := e.Acquire(ctx, key, 2, time.Minute); return err },
		"Extend":  func() error { _, err := e.Extend(ctx, lease, time.Minute); return err },
		"Release": func() error { return e.Release(ctx, lease) },
	} {
		if err := call(); !errors.Is(err, engine.ErrUnknownLayout) || !containsAll(err.Error(), key, "a string") {
			t.Errorf("%s of a lease key holding a string: %v; want ErrUnknownLayout naming the key and a string", name, err)
		}
		wantUntouched(t, c, name, full, before)
	}
}

// Lease calls are counted as decisions are: operation acquire, extend or release, with their
// outcome, a duration each; fail-open and errors as for decisions.
func TestLeaseMetricsCountEveryOutcome(t *testing.T) {
	own := valkeytest.New(t, valkeytest.OwnServer())
	c := own.Client(t)
	ctx := context.Background()
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer mp.Shutdown(ctx)
	e, clock := enginetest.Clocked(t, c, engine.WithMeterProvider(mp))
	open := enginetest.New(t, c, engine.WithMeterProvider(mp), engine.WithFailOpen(true))
	key := enginetest.NewKey(t)

	held, err := e.Acquire(ctx, key, 1, time.Second) // acquire/allowed
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.Acquire(ctx, key, 1, time.Second); !errors.Is(err, engine.ErrRateLimitExceeded) { // acquire/denied
		t.Fatalf("second holder of one slot: %v", err)
	}
	if held, err = e.Extend(ctx, held, time.Second); err != nil { // extend/allowed
		t.Fatal(err)
	}
	if err := e.Release(ctx, held); err != nil { // release/allowed
		t.Fatal(err)
	}
	if err := e.Release(ctx, held); err != nil { // release/denied: nothing to release
		t.Fatal(err)
	}
	clock.Set(clock.Now().Add(time.Hour))
	if _, err := e.Extend(ctx, held, time.Second); !errors.Is(err, engine.ErrLeaseExpired) { // extend/denied
		t.Fatalf("extend of a released lease: %v", err)
	}
	if err := own.Stop(); err != nil {
		t.Fatal(err)
	}
	tctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	if l, err := open.Acquire(tctx, key, 1, time.Second); err != nil || l.BackendErr == nil { // acquire/fail_open
		t.Fatalf("fail-open with the server down: %+v, %v", l, err)
	}
	if err := e.Release(tctx, held); err == nil { // release/error
		t.Fatal("release with the server down: no error")
	}

	got := collected(t, reader)
	want := map[string]int64{
		"acquire/allowed": 1, "acquire/denied": 1, "acquire/fail_open": 1,
		"extend/allowed": 1, "extend/denied": 1,
		"release/allowed": 1, "release/denied": 1, "release/error": 1,
	}
	for _, name := range []string{"strictrate.decisions", "strictrate.decision.duration"} {
		for attrs, n := range want {
			if got[name][attrs] != n {
				t.Errorf("%s{%s} = %d, want %d (all: %v)", name, attrs, got[name][attrs], n, got[name])
			}
		}
		if len(got[name]) != len(want) {
			t.Errorf("%s has points %v, want exactly %v", name, got[name], want)
		}
	}
}

// abandonedTTL is the ttl of the leases these tests abandon: far beyond any bound they wait
// for, so that a lease left behind is found held, not expired.
const abandonedTTL = time.Hour

// waitNoLeases waits, with a generous bound, until none of keys holds a lease.
func waitNoLeases(t *testing.T, c valkey.Client, what string, keys ...string) {
	t.Helper()
	if err := valkeytest.WaitFor(context.Background(), 30*time.Second, what, func() (bool, error) {
		for _, key := range keys {
			if leaseCount(t, c, key) != 0 {
				return false, nil
			}
		}
		return true, nil
	}); err != nil {
		for _, key := range keys {
			t.Logf("key %q holds %d leases", key, leaseCount(t, c, key))
		}
		t.Fatal(err)
	}
}

// An Acquire whose caller gives up while the server does not answer (its deadline passes, or
// it is cancelled; fail-closed or fail-open) holds nothing once the server answers again: the
// lease the script grants then, to nobody, is released. A fail-open caller whose deadline
// passed gets a lease without a slot; a cancelled one its context's error. An Extend whose
// caller gave up leaves the lease to its holder, who then releases it.
func TestAcquireAbandonedHoldsNoSlot(t *testing.T) {
	srv := valkeytest.New(t, valkeytest.OwnServer())
	t.Cleanup(func() { _ = srv.Resume() })
	admin := srv.Client(t)
	// Each engine on a client of its own: a call that a deadline cuts short may close its
	// connection, and must not take another engine's calls with it.
	closed := enginetest.New(t, srv.Client(t))
	open := enginetest.New(t, srv.Client(t), engine.WithFailOpen(true))
	extender := enginetest.New(t, srv.Client(t))
	ctx := context.Background()
	held := mustAcquire(t, extender, enginetest.NewKey(t), 1, abandonedTTL)
	deadlineKey, cancelledKey, openKey := enginetest.NewKey(t), enginetest.NewKey(t), enginetest.NewKey(t)
	// Each engine's connection is up before the pause: a dial would wait for the server, and
	// nothing would be sent.
	mustRelease(t, closed, mustAcquire(t, closed, deadlineKey, 1, abandonedTTL))
	mustRelease(t, open, mustAcquire(t, open, openKey, 1, abandonedTTL))
	before := scriptCalls(t, admin)

	if err := srv.Pause(); err != nil {
		t.Fatal(err)
	}
	short := func() (context.Context, context.CancelFunc) { return context.WithTimeout(ctx, 20*time.Millisecond) }
	// The Extend first: should it wait for a connection's dial, the Acquires' callers have not
	// left yet, and the server answers well within leaseCleanupTimeout (5 s) of their leaving.
	dctx, cancel := short()
	_, err := extender.Extend(dctx, held, abandonedTTL)
	cancel()
	if err == nil {
		t.Fatal("Extend past its deadline, server paused: no error")
	}
	dctx, cancel = short()
	l, err := closed.Acquire(dctx, deadlineKey, 1, abandonedTTL)
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) || l != (engine.Lease{}) {
		t.Fatalf("fail-closed Acquire past its deadline, server paused: %+v, %v; want no lease and the deadline's error", l, err)
	}
	cctx, cancel := context.WithCancel(ctx)
	stop := time.AfterFunc(20*time.Millisecond, cancel)
	l, err = open.Acquire(cctx, cancelledKey, 1, abandonedTTL)
	stop.Stop()
	cancel()
	if !errors.Is(err, context.Canceled) || l != (engine.Lease{}) {
		t.Fatalf("fail-open Acquire cancelled, server paused: %+v, %v; want no lease and context.Canceled", l, err)
	}
	dctx, cancel = short()
	l, err = open.Acquire(dctx, openKey, 1, abandonedTTL)
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) || l != (engine.Lease{}) {
		t.Fatalf("fail-open Acquire past its deadline, server paused: %+v, %v; want no lease and the deadline's error (a caller's own end is never fail-open)", l, err)
	}
	if err := srv.Resume(); err != nil {
		t.Fatal(err)
	}

	// The four scripts sent during the pause run once the server does (some of those that ran
	// may be the releases that follow them).
	if err := valkeytest.WaitFor(ctx, 30*time.Second, "the scripts sent during the pause to run", func() (bool, error) {
		return scriptCalls(t, admin) >= before+4, nil
	}); err != nil {
		t.Fatal(err)
	}
	waitNoLeases(t, admin, "the abandoned leases to be released", deadlineKey, cancelledKey, openKey)
	// The abandoned Extend may have landed: the lease is still its holder's, to release.
	enginetest.Want(t, "leases of the extended key", leaseCount(t, admin, held.Key), int64(1))
	mustRelease(t, extender, held)
	enginetest.Want(t, "leases of the extended key after its release", leaseCount(t, admin, held.Key), int64(0))
	// Every key has its one slot: nothing is held by a caller that left.
	for _, key := range []string{deadlineKey, cancelledKey, openKey} {
		mustRelease(t, closed, mustAcquire(t, closed, key, 1, time.Minute))
	}
}

// A storm of Acquires with tiny deadlines (20 µs to 5 ms) on one key, max 4, from 32
// goroutines over 4 clients: whoever got a lease releases it, and then the key holds none;
// the holders that got a lease were never more than max at once.
func TestAcquireStormOfDeadlinesHoldsNoSlot(t *testing.T) {
	es, c := enginetest.Engines(t, exampleServer, 4)
	key, max := enginetest.NewKey(t), 4
	var (
		holders, peak, granted, gaveUp atomic.Int64
		wg                             sync.WaitGroup
		errs                           = make(chan error, 32)
	)
	for g := range 32 {
		e := es[g%len(es)]
		rng := rand.New(rand.NewPCG(uint64(g), 4))
		wg.Go(func() {
			for range 80 {
				ctx, cancel := context.WithTimeout(context.Background(), 20*time.Microsecond+time.Duration(rng.Int64N(int64(5*time.Millisecond-20*time.Microsecond))))
				l, err := e.Acquire(ctx, key, max, abandonedTTL)
				cancel()
				switch {
				case err == nil:
					granted.Add(1)
					n := holders.Add(1)
					for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
					}
					time.Sleep(time.Duration(rng.IntN(200)) * time.Microsecond)
					holders.Add(-1)
					if err := e.Release(context.Background(), l); err != nil {
						errs <- err
						return
					}
				case errors.Is(err, context.DeadlineExceeded) || errors.Is(err, engine.ErrUnavailable):
					// The caller gave up, or its call failed without saying whether it
					// granted (its deadline cut a dial short, say): either way no lease
					// may outlive it.
					gaveUp.Add(1)
				case !errors.Is(err, engine.ErrRateLimitExceeded):
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	t.Logf("%d leases granted and released, %d callers gave up, at most %d holders at once (max %d)",
		granted.Load(), gaveUp.Load(), peak.Load(), max)
	if peak.Load() > int64(max) {
		t.Fatalf("%d holders at once, above max %d", peak.Load(), max)
	}
	if gaveUp.Load() == 0 {
		t.Fatal("no caller gave up before its reply: nothing was tested")
	}
	waitNoLeases(t, c, "every lease of the storm to be released", key)
}

// A lease the server granted but no replica acknowledged (WithReplicaAck, a server without
// replicas) is an error wrapping ErrUnavailable, and it holds no slot: the caller did not
// get it, so it is released.
func TestAcquireNotAcknowledgedHoldsNoSlot(t *testing.T) {
	c := exampleServer.Client(t)
	e := enginetest.New(t, c, engine.WithReplicaAck(1, 20*time.Millisecond))
	key := enginetest.NewKey(t)
	if l, err := e.Acquire(context.Background(), key, 1, abandonedTTL); !errors.Is(err, engine.ErrUnavailable) || l != (engine.Lease{}) {
		t.Fatalf("Acquire that no replica acknowledged: %+v, %v; want no lease and ErrUnavailable", l, err)
	}
	waitNoLeases(t, c, "the lease no replica acknowledged to be released", key)
}
