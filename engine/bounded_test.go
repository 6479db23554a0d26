package engine_test

import (
	"bufio"
	"context"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/valkey-io/valkey-go"

	"github.com/strictrate/strictrate/engine"
	"github.com/strictrate/strictrate/internal/enginetest"
	"github.com/strictrate/strictrate/internal/valkeytest"
)

// entriesRead runs f and returns how many list elements the scripts asked the server for while
// it ran (each LRANGE's span, each LINDEX one), read from the server's MONITOR stream, which
// shows every command a script runs. The server must be the test's own: every client's
// commands count.
func entriesRead(t *testing.T, s *valkeytest.Server, c valkey.Client, f func()) int {
	t.Helper()
	conn, err := net.Dial("tcp", s.Addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	r := bufio.NewReader(conn)
	if _, err := conn.Write([]byte("MONITOR\r\n")); err != nil {
		t.Fatal(err)
	}
	if line, err := r.ReadString('\n'); err != nil || !strings.HasPrefix(line, "+OK") {
		t.Fatalf("MONITOR: %q, %v", line, err)
	}
	f()
	// Everything f sent has run once the server echoes a marker sent after it.
	marker := uuid.NewString()
	if err := c.Do(context.Background(), c.B().Echo().Message(marker).Build()).Error(); err != nil {
		t.Fatal(err)
	}
	reads := 0
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			t.Fatalf("reading MONITOR: %v", err)
		}
		if strings.Contains(line, marker) {
			return reads
		}
		_, cmd, ok := strings.Cut(line, "[0 lua] ")
		if !ok {
			continue
		}
		args := strings.Split(strings.TrimSpace(cmd), " ")
		switch strings.Trim(args[0], `"`) {
		case "LINDEX":
			reads++
		case "LRANGE":
			from, _ := strconv.Atoi(strings.Trim(args[len(args)-2], `"`))
			to, _ := strconv.Atoi(strings.Trim(args[len(args)-1], `"`))
			reads += to - from + 1
		}
	}
}

// A busy key that no write touched while most of its entries left its window costs a call
// what a fresh one does: 24,000 entries of cost 1 in a 4 s window, 70 % of them gone, no
// write since. A Peek, a policy's peek, an AllowAll whose group another key denies (its checks
// write nothing) and the first write after the idle stretch each read a few dozen entries
// (the window's start is found by its time, and the events after it counted by number), where
// they read every entry that left, 16,801 of them, on every read-only call. Every answer is
// exact.
func TestCallsAfterAnIdleStretchReadLittle(t *testing.T) {
	own := valkeytest.New(t, valkeytest.OwnServer())
	c := own.Client(t)
	e, clock := enginetest.Clocked(t, c)
	ctx := context.Background()
	l := engine.Limit{Max: 30_000, Window: 4 * time.Second}
	key := enginetest.NewKey(t)
	// 3,000 rounds of 8 requests, 800 µs apart: 24,000 entries over 2.4 s.
	const rounds, perRound, spacing = 3000, 8, 800 * time.Microsecond
	for i := range rounds {
		clock.Set(enginetest.T0.Add(time.Duration(i) * spacing))
		var wg sync.WaitGroup
		for range perRound {
			wg.Go(func() {
				if r, err := e.Allow(ctx, key, l); err != nil || !r.Allowed {
					t.Errorf("filling: %+v, %v", r, err)
				}
			})
		}
		wg.Wait()
	}
	// 2,100 rounds (16,800 entries) leave the window, and the first entry of the next round
	// at its edge (at or before now - window) too.
	clock.Set(enginetest.T0.Add(2100*spacing + l.Window))
	live := int64(rounds-2100)*perRound - perRound
	const bound = 200
	check := func(what string, f func()) {
		t.Helper()
		n := entriesRead(t, own, c, f)
		if n > bound {
			t.Errorf("%s read %d entries, want at most %d: it walked the entries that left the window", what, n, bound)
		}
		t.Logf("%s: %d entries read", what, n)
	}
	for i := range 3 {
		check("a Peek", func() {
			if r := enginetest.MustPeek(t, e, key, l); int64(r.Remaining) != int64(l.Max)-live {
				t.Errorf("Peek %d: %d remaining, want %d", i, r.Remaining, int64(l.Max)-live)
			}
		})
	}
	// A shorter window, whose cursor the log does not keep: its start is found the same way.
	// Rounds 2726 to 2999 are in its last 3.5 s: 2,192 events.
	policy := engine.Policy{{Max: 2500, Window: 3500 * time.Millisecond}, l}
	check("a policy's peek", func() {
		r, err := e.PeekPolicy(ctx, key, policy, 1)
		if err != nil || !r.Allowed || r.Remaining != 2500-2192 || r.Window != policy[0].Window {
			t.Errorf("PeekPolicy: %+v, %v; want admitted with %d remaining in the 3.5 s window", r, err, 2500-2192)
		}
	})
	denier := enginetest.NewKey(t)
	enginetest.MustAllowN(t, e, denier, engine.PerMinute(1), 1)
	check("an AllowAll denied by another key", func() {
		ok, rs, err := e.AllowAll(ctx, []engine.Request{{Key: key, Policy: engine.Policy{l}, N: 1},
			{Key: denier, Policy: engine.Policy{engine.PerMinute(1)}, N: 1}})
		if err != nil || ok || !rs[0].Allowed || int64(rs[0].Remaining) != int64(l.Max)-live {
			t.Errorf("AllowAll: %v, %+v, %v; want denied by the other key, the busy key with %d remaining", ok, rs, err, int64(l.Max)-live)
		}
	})
	check("the first write after the idle stretch", func() {
		if r := enginetest.MustAllowN(t, e, key, l, 1); !r.Allowed || int64(r.Remaining) != int64(l.Max)-live-1 {
			t.Errorf("the first write: %+v, want admitted with %d remaining", r, int64(l.Max)-live-1)
		}
	})
	check("the next write", func() { enginetest.MustAllowN(t, e, key, l, 1) })
	enginetest.Want(t, "events in the log", enginetest.StoredEvents(t, c, key), live+2)
}
