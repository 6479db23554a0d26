package sendctx

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"testing"
	"time"
)

type key struct{}

// Of hides the deadline and nothing else: the call still ends when the caller's context does,
// with the caller's error, and sees its values.
func TestOfHidesTheDeadlineOnly(t *testing.T) {
	parent, cancel := context.WithTimeout(context.WithValue(context.Background(), key{}, "v"), time.Hour)
	ctx := Of(parent)
	if _, ok := ctx.Deadline(); ok {
		t.Fatal("Of kept the deadline")
	}
	if ctx.Value(key{}) != "v" {
		t.Fatal("Of lost a value")
	}
	if ctx.Done() == nil || ctx.Err() != nil {
		t.Fatalf("Of of a live context: Done %v, Err %v", ctx.Done(), ctx.Err())
	}
	cancel()
	<-ctx.Done()
	if !errors.Is(ctx.Err(), context.Canceled) {
		t.Fatalf("Err after the caller cancelled: %v", ctx.Err())
	}
	plain := context.Background()
	if Of(plain) != plain {
		t.Fatal("Of changed a context without a deadline")
	}
}

func TestUnsent(t *testing.T) {
	live := context.Background()
	done, cancel := context.WithCancel(live)
	cancel()
	dial := &net.OpError{Op: "dial", Net: "tcp", Err: errors.New("connection refused")}
	read := &net.OpError{Op: "read", Net: "tcp", Err: errors.New("connection reset")}
	for _, tc := range []struct {
		name string
		ctx  context.Context
		err  error
		want bool
	}{
		{"no error", live, nil, false},
		{"a dial that failed", live, fmt.Errorf("wrapped: %w", dial), true},
		{"a dial another caller cut short", live, context.Canceled, true},
		{"a handshake past the dial timeout", live, context.DeadlineExceeded, true},
		{"a read after the call was written", live, read, false},
		{"the connection's own timeout", live, os.ErrDeadlineExceeded, false},
		{"a server's reply", live, errors.New("ERR something"), false},
		{"the caller gave up", done, context.Canceled, false},
		{"a dial after the caller gave up", done, dial, false},
	} {
		if got := Unsent(tc.ctx, tc.err); got != tc.want {
			t.Errorf("%s: Unsent = %v, want %v", tc.name, got, tc.want)
		}
	}
}

// Send sends again only what was not written, at most maxSends times, and never for a caller
// that gave up.
func TestSendRetriesOnlyUnsentCalls(t *testing.T) {
	dial := &net.OpError{Op: "dial", Err: errors.New("refused")}
	errOf := func(err error) error { return err }
	for _, tc := range []struct {
		name  string
		ctx   func() context.Context
		errs  []error // the errors of successive sends; nil after the last
		sends int
	}{
		{"a success", context.Background, nil, 1},
		{"a dial cut short, then a success", context.Background, []error{context.Canceled}, 2},
		{"dials that keep failing", context.Background, []error{dial, dial, dial, dial}, maxSends},
		{"a written call", context.Background, []error{errors.New("reset")}, 1},
		{"a caller that gave up", func() context.Context {
			ctx, cancel := context.WithCancel(context.Background())
			cancel()
			return ctx
		}, []error{context.Canceled}, 1},
	} {
		sends := 0
		ctx := tc.ctx()
		Send(ctx, func(callCtx context.Context) error {
			if _, ok := callCtx.Deadline(); ok {
				t.Errorf("%s: a send got a deadline", tc.name)
			}
			sends++
			if sends <= len(tc.errs) {
				return tc.errs[sends-1]
			}
			return nil
		}, errOf)
		if sends != tc.sends {
			t.Errorf("%s: %d sends, want %d", tc.name, sends, tc.sends)
		}
	}
}

func TestPromptlyReturnsWhenTheContextEnds(t *testing.T) {
	failed := func(err error) error { return err }
	if got, taken := Promptly(context.Background(), func() error { return nil }, failed, nil); got != nil || !taken {
		t.Fatalf("a call on a context that cannot end: %v, taken %v", got, taken)
	}
	live, cancelLive := context.WithCancel(context.Background())
	defer cancelLive()
	want := errors.New("the call's own")
	if got, taken := Promptly(live, func() error { return want }, failed, nil); got != want || !taken {
		t.Fatalf("a call that came back: %v, taken %v; want its reply", got, taken)
	}
	ctx, cancel := context.WithCancel(context.Background())
	release := make(chan struct{})
	returned := make(chan error, 1)
	afterwards := make(chan bool, 1)
	go func() {
		got, _ := Promptly(ctx, func() error { <-release; return want }, failed, func(r error, taken bool) {
			if r != want {
				t.Errorf("after got %v, want the call's reply", r)
			}
			afterwards <- taken
		})
		returned <- got
	}()
	cancel()
	if got := <-returned; !errors.Is(got, context.Canceled) {
		t.Fatalf("a call held while its context ended: %v, want the context's error", got)
	}
	close(release)
	if taken := <-afterwards; taken {
		t.Fatal("after of a call whose caller left: taken, want not")
	}
	if got, _ := Promptly(live, func() error { panic("boom") }, failed, nil); got == nil {
		t.Fatal("a call that panicked came back without an error")
	}
	if _, _ = Promptly(live, func() error { return nil }, failed, func(_ error, taken bool) { afterwards <- taken }); !<-afterwards {
		t.Fatal("after of a call whose caller took its reply: not taken, want taken")
	}
}
