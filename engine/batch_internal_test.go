package engine

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/strictrate/strictrate/internal/valkeytest"
)

// waitQueued waits until q holds n waiting calls.
func waitQueued(t *testing.T, c *committer, q *queue, n int) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
		c.mu.Lock()
		got := len(q.waiting)
		c.mu.Unlock()
		if got == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d calls waiting, want %d", got, n)
		}
	}
}

// A panic while a committer goroutine sends a batch reaches every caller of the batch as its
// error; the batch is counted out, and the committer sends the next batch, and takes the
// next decision, as before. Calls go back to the pool through all of it and are reused
// without carrying anything over.
func TestBatchPanicReachesEveryCaller(t *testing.T) {
	client := valkeytest.New(t).Client(t)
	e, err := New(client, WithBatching(true))
	if err != nil {
		t.Fatal(err)
	}
	c, ctx := e.decides, context.Background()
	good := e.oneLimit(Limit{Max: 10, Window: time.Minute})
	req := func(set *limitSet) request {
		r, err := newRequest(e.prefix+"batchpanic:"+uuid.NewString(), clockReading{}, 1, true, set)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	// Hold the destination busy, as a call in flight does, so that the requests queue.
	c.mu.Lock()
	q := c.queue(&request{})
	q.inFlight++
	c.mu.Unlock()

	// The first batch panics (a request without limits); the second waits behind it.
	var wg sync.WaitGroup
	outs := make([]outcome, 5)
	for i := range 3 {
		wg.Go(func() { outs[i] = c.do(ctx, req(nil)) })
	}
	waitQueued(t, c, q, 3)
	for i := 3; i < 5; i++ {
		wg.Go(func() { outs[i] = c.do(ctx, req(good)) })
	}
	waitQueued(t, c, q, 5)
	// Taken as a committer would, the five would go in one batch: take the three by hand.
	b := getBatch()
	c.mu.Lock()
	q.inFlight--
	b.calls = append(b.calls[:0], q.waiting[:3]...)
	q.waiting = append(q.waiting[:0], q.waiting[3:]...)
	for _, cl := range b.calls {
		cl.sent = true
	}
	q.inFlight++
	c.mu.Unlock()
	c.sendTaken(q, b) // sends the panicking batch, then the waiting one, on this goroutine
	wg.Wait()
	for i, out := range outs {
		switch {
		case i < 3 && (out.err == nil || !strings.Contains(out.err.Error(), "panic")):
			t.Errorf("caller %d of the panicking batch: %v, want the panic", i, out.err)
		case i >= 3 && (out.err != nil || out.replyErr != nil || !out.admits()):
			t.Errorf("caller %d of the next batch: %+v, want an admission", i, out)
		}
	}
	c.mu.Lock()
	inFlight, waiting := q.inFlight, len(q.waiting)
	c.mu.Unlock()
	if inFlight != 0 || waiting != 0 {
		t.Fatalf("after both batches: %d in flight, %d waiting; want none", inFlight, waiting)
	}
	for range 3 {
		if out := c.do(ctx, req(good)); out.err != nil || !out.admits() || out.d.remaining != 9 {
			t.Fatalf("a decision after the panic: %+v, want an admission with 9 remaining", out)
		}
	}
}

// A caller whose context ends after its request was taken into a batch leaves its call to the
// batch, which still signals it; the call is not reused while the batch may write to it.
func TestBatchCallerGoneAfterSend(t *testing.T) {
	client := valkeytest.New(t).Client(t)
	e, err := New(client, WithBatching(true))
	if err != nil {
		t.Fatal(err)
	}
	c := e.decides
	set := e.oneLimit(Limit{Max: 10, Window: time.Minute})
	c.mu.Lock()
	q := c.queue(&request{})
	q.inFlight++
	c.mu.Unlock()
	ctx, cancel := context.WithCancel(context.Background())
	r, _ := newRequest(e.prefix+"gone:"+uuid.NewString(), clockReading{}, 1, true, set)
	done := make(chan outcome)
	go func() { done <- c.do(ctx, r) }()
	waitQueued(t, c, q, 1)
	b := getBatch()
	c.mu.Lock()
	q.inFlight--
	c.take(q, b)
	c.mu.Unlock()
	cancel()
	if out := <-done; out.err != context.Canceled {
		t.Fatalf("the cancelled caller got %+v, want context.Canceled", out)
	}
	cl := b.calls[0]
	c.sendTaken(q, b)
	select {
	case <-cl.done:
	default:
		t.Fatal("the batch did not signal the call of the caller that left")
	}
	if cl.out.err != nil || !cl.out.admits() {
		t.Fatalf("the left call's outcome: %+v, want an admission", cl.out)
	}
}

// BenchmarkCommitterBatched takes decisions on many keys through one committer from 64
// goroutines: the committer's own allocations per decision (no key prefixing, no Result).
func BenchmarkCommitterBatched(b *testing.B) {
	client := valkeytest.New(b).Client(b)
	e, err := New(client, WithBatching(true))
	if err != nil {
		b.Fatal(err)
	}
	set := e.oneLimit(Limit{Max: 1 << 20, Window: time.Second})
	keys := make([]request, 1024)
	for i := range keys {
		if keys[i], err = newRequest(e.prefix+"bench:"+uuid.NewString(), clockReading{}, 1, true, set); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportAllocs()
	b.SetParallelism(32)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		ctx, i := context.Background(), 0
		for pb.Next() {
			if out := e.decides.do(ctx, keys[i%len(keys)]); out.err != nil || out.replyErr != nil {
				b.Error(out.err, out.replyErr)
				return
			}
			i += 7
		}
	})
}
