package transport

import (
	"context"
	"errors"
	"io"
	"net"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/valkey-io/valkey-go"

	"github.com/strictrate/strictrate/loader"
)

// The group commit alone, with a fake exec in place of the server, as groupcache tests its
// singleflight: requests are numbers, a reply is the number doubled.

// fake is an exec that answers each request with its number doubled, records the calls it
// got, and can hold a call until the test lets it go, fail one whole, or fail a request.
type fake struct {
	mu    sync.Mutex
	calls [][]int // the requests of each call, in the order exec got them
	nodes []bool  // whether each call went to a node (false: the engine's client)
	// hold, when set, is asked for a gate each call waits on before it answers; nil: none.
	hold func(reqs []int) chan struct{}
	// fail, when set, gives the call's whole error (nil: none).
	fail func(reqs []int, alone bool) error
	// bad, when set, gives a request's own error reply (nil: none).
	bad func(req int) error
}

func (f *fake) exec(_ context.Context, node valkey.Client, reqs []int, outs []Outcome[int], _ *scratch) (ackReplies, error) {
	f.mu.Lock()
	f.calls = append(f.calls, append([]int(nil), reqs...))
	f.nodes = append(f.nodes, node != nil)
	f.mu.Unlock()
	if f.hold != nil {
		if gate := f.hold(reqs); gate != nil {
			<-gate // as a server that answers in its own time, whatever the callers do
		}
	}
	if f.fail != nil {
		if err := f.fail(reqs, len(reqs) == 1); err != nil {
			for i := range outs {
				outs[i] = Outcome[int]{Err: err}
			}
			return ackReplies{}, err
		}
	}
	for i, r := range reqs {
		outs[i] = Outcome[int]{Reply: 2 * r, Recorded: true}
		if f.bad != nil {
			if err := f.bad(r); err != nil {
				outs[i] = Outcome[int]{Err: err}
			}
		}
	}
	return ackReplies{}, nil
}

// got is the requests of every call exec got, in order.
func (f *fake) got() [][]int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([][]int(nil), f.calls...)
}

// newFake is a group commit of numbers on a standalone transport, batching on, whose calls
// f answers.
func newFake(f *fake) *Commit[int, int] {
	t := &Transport{batching: true}
	c := NewCommit(t, Kind[int, int]{
		Single: loader.New("single", "return 1"), Batch: loader.New("batch", "return 2"),
		Size: func(*int) (int, int) { return 1, 8 },
	})
	c.exec = f.exec
	return c
}

// waiting waits until dest's queue of c holds n requests.
func waiting(t *testing.T, c *Commit[int, int], n int) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
		c.mu.Lock()
		got := 0
		if q := c.queues[Dest{}]; q != nil {
			got = len(q.waiting)
		}
		c.mu.Unlock()
		if got == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d requests waiting, want %d", got, n)
		}
	}
}

// idle fails t unless c holds no call in flight and no request waiting.
func idle(t *testing.T, c *Commit[int, int]) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
		c.mu.Lock()
		q := c.queues[Dest{}]
		busy := q != nil && (q.inFlight != 0 || len(q.waiting) != 0)
		c.mu.Unlock()
		if !busy {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("the group commit never went idle")
		}
	}
}

// gate is a channel a held call waits on, and whether it was asked for.
type gate struct {
	ch    chan struct{}
	asked chan struct{}
	once  sync.Once
}

func newGate() *gate { return &gate{ch: make(chan struct{}), asked: make(chan struct{})} }

// take hands out the gate, and says it was asked for.
func (g *gate) take() chan struct{} {
	g.once.Do(func() { close(g.asked) })
	return g.ch
}

// doAll runs Do for each of reqs on a goroutine of its own, each on ctx, and returns their
// outcomes once all came back.
func doAll(c *Commit[int, int], ctx context.Context, reqs ...int) func() []Outcome[int] {
	outs := make([]Outcome[int], len(reqs))
	var wg sync.WaitGroup
	for i, r := range reqs {
		wg.Go(func() { outs[i] = c.Do(ctx, r, Dest{}) })
	}
	return func() []Outcome[int] { wg.Wait(); return outs }
}

// Concurrent requests that arrive while a call is in flight leave together in the next call,
// one batch, and each caller gets its own reply.
func TestCommitCoalescesConcurrentRequests(t *testing.T) {
	first := newGate()
	f := &fake{hold: func(reqs []int) chan struct{} {
		if len(reqs) == 1 && reqs[0] == 0 {
			return first.take()
		}
		return nil
	}}
	c := newFake(f)
	lead := doAll(c, context.Background(), 0)
	<-first.asked
	rest := doAll(c, context.Background(), 1, 2, 3, 4, 5, 6, 7, 8, 9)
	waiting(t, c, 9)
	close(first.ch)
	outs := append(lead(), rest()...)
	for i, o := range outs {
		if o.Err != nil || o.Reply != 2*i || !o.Recorded {
			t.Errorf("request %d: %+v, want reply %d", i, o, 2*i)
		}
	}
	calls := f.got()
	if len(calls) != 2 || len(calls[0]) != 1 || len(calls[1]) != 9 {
		t.Fatalf("calls %v, want the first alone, then the nine that waited in one batch", calls)
	}
	idle(t, c)
}

// A batch's failure reaches only its own callers: the call before it, the batch after it, and
// the other requests of a batch one of whose requests the server refused, are answered.
func TestCommitBatchFailureReachesOnlyItsCallers(t *testing.T) {
	first, second := newGate(), newGate()
	boom := errors.New("boom")
	f := &fake{
		hold: func(reqs []int) chan struct{} {
			switch {
			case slices.Contains(reqs, 0):
				return first.take()
			case slices.Contains(reqs, 10):
				return second.take()
			}
			return nil
		},
		fail: func(reqs []int, _ bool) error {
			if slices.Contains(reqs, 10) {
				return boom
			}
			return nil
		},
		bad: func(r int) error {
			if r == 21 {
				return errors.New("ERR this request alone")
			}
			return nil
		},
	}
	c := newFake(f)
	lead := doAll(c, context.Background(), 0)
	<-first.asked
	failing := doAll(c, context.Background(), 10, 11, 12)
	waiting(t, c, 3)
	close(first.ch)
	<-second.asked // the failing batch is in flight
	after := doAll(c, context.Background(), 20, 21, 22)
	waiting(t, c, 3)
	close(second.ch)
	if o := lead()[0]; o.Err != nil || o.Reply != 0 {
		t.Errorf("the call before: %+v, want its reply", o)
	}
	for i, o := range failing() {
		if !errors.Is(o.Err, boom) {
			t.Errorf("request %d of the failing batch: %+v, want its call's error", 10+i, o)
		}
	}
	for i, o := range after() {
		switch r := 20 + i; {
		case r == 21 && (o.Err == nil || !strings.Contains(o.Err.Error(), "alone")):
			t.Errorf("the refused request: %+v, want its own error", o)
		case r != 21 && (o.Err != nil || o.Reply != 2*r):
			t.Errorf("request %d of the batch after: %+v, want reply %d", r, o, 2*r)
		}
	}
	if calls := f.got(); len(calls) != 3 {
		t.Fatalf("calls %v, want three: nothing sent again", calls)
	}
	idle(t, c)
}

// A caller whose context ends returns at once with its context's error, whether its request
// waits in a queue (it is taken out and never sent), rides in a batch in flight, or is in a
// call of its own (the call goes on: once sent, it may be applied); the others get their
// replies, and the batch goes on to its end.
func TestCommitCallerLeavesPromptlyWhileTheBatchGoesOn(t *testing.T) {
	first, second := newGate(), newGate()
	f := &fake{hold: func(reqs []int) chan struct{} {
		switch {
		case slices.Contains(reqs, 0):
			return first.take()
		case slices.Contains(reqs, 10):
			return second.take()
		}
		return nil
	}}
	c := newFake(f)
	leadCtx, leaveLead := context.WithCancel(context.Background())
	lead := doAll(c, leadCtx, 0)
	<-first.asked
	queuedCtx, leaveQueued := context.WithCancel(context.Background())
	queued := doAll(c, queuedCtx, 99)
	waiting(t, c, 1)
	leaveQueued()
	if o := queued()[0]; !errors.Is(o.Err, context.Canceled) {
		t.Fatalf("a caller that left while queued: %+v, want context.Canceled", o)
	}
	waiting(t, c, 0)
	leaveLead()
	if o := lead()[0]; !errors.Is(o.Err, context.Canceled) {
		t.Fatalf("a caller that left its call in flight: %+v, want context.Canceled", o)
	}
	// The lead's call is still in flight: requests queue behind it.
	inBatchCtx, leaveInBatch := context.WithCancel(context.Background())
	inBatch := doAll(c, inBatchCtx, 10)
	stays := doAll(c, context.Background(), 11)
	waiting(t, c, 2)
	close(first.ch)
	<-second.asked
	leaveInBatch()
	if o := inBatch()[0]; !errors.Is(o.Err, context.Canceled) {
		t.Fatalf("a caller that left its batch in flight: %+v, want context.Canceled", o)
	}
	close(second.ch)
	if o := stays()[0]; o.Err != nil || o.Reply != 22 {
		t.Fatalf("the caller that stayed in the batch: %+v, want reply 22", o)
	}
	for _, call := range f.got() {
		for _, r := range call {
			if r == 99 {
				t.Fatal("the request whose caller left while queued was sent")
			}
		}
	}
	idle(t, c)
}

// A batch whose call never ran (a connection that could not be opened) sends each of its
// requests again, alone, once, through the engine's client; one whose call may have run (a
// connection lost once written) is each caller's error, and nothing goes again.
func TestCommitRetriesWhatWasNotTaken(t *testing.T) {
	for _, tc := range []struct {
		name  string
		err   error
		again bool
	}{
		{"refused before it was written", &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}, true},
		{"lost once written", io.EOF, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			first := newGate()
			f := &fake{
				hold: func(reqs []int) chan struct{} {
					if reqs[0] == 0 {
						return first.take()
					}
					return nil
				},
				fail: func(reqs []int, alone bool) error {
					if !alone {
						return tc.err
					}
					return nil
				},
			}
			c := newFake(f)
			lead := doAll(c, context.Background(), 0)
			<-first.asked
			rest := doAll(c, context.Background(), 1, 2, 3)
			waiting(t, c, 3)
			close(first.ch)
			lead()
			for i, o := range rest() {
				r := 1 + i
				switch {
				case tc.again && (o.Err != nil || o.Reply != 2*r):
					t.Errorf("request %d, sent again: %+v, want reply %d", r, o, 2*r)
				case !tc.again && !errors.Is(o.Err, tc.err):
					t.Errorf("request %d: %+v, want the call's error", r, o)
				}
			}
			calls, want := f.got(), 2
			if tc.again {
				want = 5 // the lead, the batch, and each of its three alone
			}
			if len(calls) != want || c.Retried() != int64(want-2) {
				t.Fatalf("calls %v, %d retried; want %d calls", calls, c.Retried(), want)
			}
			for _, call := range calls[2:] {
				if len(call) != 1 {
					t.Fatalf("a request sent again in a call of %d, want alone", len(call))
				}
			}
			idle(t, c)
		})
	}
}

// A panic while a committer goroutine sends a batch reaches every caller of the batch as its
// error; the batch is counted out, and the committer sends the next batch as before.
func TestCommitBatchPanicReachesEveryCaller(t *testing.T) {
	first, second := newGate(), newGate()
	f := &fake{
		hold: func(reqs []int) chan struct{} {
			switch {
			case slices.Contains(reqs, 0):
				return first.take()
			case slices.Contains(reqs, 10):
				return second.take()
			}
			return nil
		},
		bad: func(r int) error {
			if r == 10 {
				panic("boom")
			}
			return nil
		},
	}
	c := newFake(f)
	lead := doAll(c, context.Background(), 0)
	<-first.asked
	panicking := doAll(c, context.Background(), 10, 11)
	waiting(t, c, 2)
	close(first.ch)
	<-second.asked
	next := doAll(c, context.Background(), 20, 21)
	waiting(t, c, 2)
	close(second.ch)
	lead()
	for i, o := range panicking() {
		if o.Err == nil || !strings.Contains(o.Err.Error(), "panic") {
			t.Errorf("request %d of the panicking batch: %+v, want the panic", 10+i, o)
		}
	}
	for i, o := range next() {
		if o.Err != nil || o.Reply != 2*(20+i) {
			t.Errorf("request %d of the next batch: %+v, want its reply", 20+i, o)
		}
	}
	idle(t, c)
	if o := c.Do(context.Background(), 5, Dest{}); o.Err != nil || o.Reply != 10 {
		t.Fatalf("a request after the panic: %+v, want reply 10", o)
	}
}
