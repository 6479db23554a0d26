package engine

import (
	"context"
	"encoding/binary"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/valkey-io/valkey-go"

	"github.com/strictrate/strictrate/internal/transport"
	"github.com/strictrate/strictrate/internal/valkeytest"
	"github.com/strictrate/strictrate/loader"
	"github.com/strictrate/strictrate/scripts"
)

// The one contract between the scripts' replies (lib_reply.lua's encode_decision) and the one
// decoder (decodeDecisions): the same decisions, taken through the single script and through
// the batch script, decode to the same values, which are the ones the log's history implies;
// first with every value at its default (the reply leaves them all out), then with every
// value an admission can set away from its default, then a denial.
func TestSingleAndBatchRepliesDecodeAlike(t *testing.T) {
	server := valkeytest.New(t)
	client := server.Client(t)
	ctx := context.Background()
	t0 := time.Date(2031, 5, 6, 7, 8, 9, 0, time.UTC)
	now := t0
	e, err := New(client, WithClock(func() time.Time { return now }), WithBatching(false))
	if err != nil {
		t.Fatal(err)
	}
	us := func(d time.Duration) int64 { return d.Microseconds() }
	long := e.policySet(Policy{{Max: 10, Window: time.Second}, {Max: 100, Window: 2 * time.Hour}})
	tight := e.policySet(Policy{{Max: 10, Window: time.Second}, {Max: 4, Window: time.Hour}})
	one := e.oneLimit(Limit{Max: 3, Window: time.Second})

	// decideBoth takes a decision of n events against set on each key of pair: alone through
	// the single script on pair[0], and second of two in one call of the batch script on
	// pair[1] (the first of those two is a peek of another key, which changes nothing).
	scripts := e.decides.Scripts()
	call := func(reqs ...request) []transport.Outcome[decision] {
		t.Helper()
		keys, args := encodeDecisions(reqs, nil, nil)
		reply, _ := scripts[min(len(reqs), 2)-1].Exec(ctx, client, loader.Call{Keys: keys, Args: args})
		outs := make([]transport.Outcome[decision], len(reqs))
		decodeDecisions(reply, reqs, outs)
		return outs
	}
	decideBoth := func(pair [2]string, set *limitSet, n int) [2]decision {
		t.Helper()
		var got [2]decision
		at := clockReading{t: now, set: true}
		req, err := newRequest(pair[0], at, n, true, set)
		if err != nil {
			t.Fatal(err)
		}
		single := call(req)[0]
		req.key = pair[1]
		other, _ := newRequest("contract:other:"+uuid.NewString(), at, 1, true, one)
		batched := call(other, req)[1]
		for i, o := range []transport.Outcome[decision]{single, batched} {
			if o.Err != nil || o.Invalid != nil {
				t.Fatalf("decision %d: %v %v; want a decision", i, o.Err, o.Invalid)
			}
			got[i] = o.Reply
		}
		return got
	}
	wantBoth := func(what string, got [2]decision, want decision) {
		t.Helper()
		for i, via := range []string{"single script", "batch script"} {
			if got[i] != want {
				t.Errorf("%s, through the %s: %+v, want %+v", what, via, got[i], want)
			}
		}
	}
	key := func() [2]string {
		id := uuid.NewString()
		return [2]string{"contract:single:" + id, "contract:batch:" + id}
	}

	// Every default: a key's first event.
	wantBoth("a first event", decideBoth(key(), one, 1),
		decision{remaining: 2, now: now.UnixMicro(), quotaAfter: us(time.Second), resetAfter: us(time.Second), tightest: 1, seq: 1})

	// Every value an admission sets: a horizon of two hours from an earlier decision, ten
	// minutes ago; then two events in one microsecond against a policy whose hour is tightest.
	pair := key()
	decideBoth(pair, long, 1)
	now = t0.Add(10 * time.Minute)
	decideBoth(pair, tight, 1)
	wantBoth("the second event of a microsecond", decideBoth(pair, tight, 1), decision{
		remaining:  1, // the hour: 4 - 3
		now:        now.UnixMicro(),
		quotaAfter: us(50 * time.Minute), // the first event, t0, leaves the hour at t0 + 1h
		resetAfter: us(2 * time.Hour),    // the newest event plus the key's horizon
		tightest:   2,
		seq:        2,
	})
	// And a denial: 3 more need 2 events out of the hour, the second of which is now's first.
	wantBoth("a denial", decideBoth(pair, tight, 3), decision{
		remaining:  1,
		now:        now.UnixMicro(),
		retryAfter: us(time.Hour),
		quotaAfter: us(50 * time.Minute),
		resetAfter: us(2 * time.Hour),
		tightest:   2,
		seq:        1,
	})
}

// A reply the scripts never give is a reply error, not a decision; an error reply for one
// request is that request's error, and a bad value in a batch's reply fails its request alone
// (the one failure rule); a transport error is the transport's. The replies are made by the
// server, echoing the values given.
func TestDecodeDecisionsRefusesOtherReplies(t *testing.T) {
	server := valkeytest.New(t)
	client := server.Client(t)
	ctx := context.Background()
	// echo replies with ARGV[1] alone when it is the only value (a single script's reply), else
	// with an array: the number ARGV[1], then each further value as given, or as an error reply
	// when it starts with "err:" (a batch script's reply).
	const echo = `if #ARGV == 1 then return ARGV[1] end
local r = {tonumber(ARGV[1])}
for i = 2, #ARGV do
  local v = ARGV[i]
  if string.sub(v, 1, 4) == 'err:' then r[i] = {err = string.sub(v, 5)} else r[i] = v end
end
return r`
	reply := func(vals ...string) valkey.ValkeyResult {
		return client.Do(ctx, client.B().Eval().Script(echo).Numkeys(0).Arg(vals...).Build())
	}
	// be8 is v as 8 bytes, big-endian; dec is a decision of the values given (lib_reply.lua),
	// single a single script's reply of it.
	be8 := func(v int64) string {
		var b [8]byte
		binary.BigEndian.PutUint64(b[:], uint64(v))
		return string(b[:])
	}
	dec := func(vals ...int64) string {
		s := string(rune(len(vals)))
		for _, v := range vals {
			s += be8(v)
		}
		return s
	}
	single := func(now int64, vals ...int64) string { return be8(now) + dec(vals...) }
	set := newLimitSet([]Limit{{Max: 5, Window: time.Second}, {Max: 100, Window: time.Hour}})
	read := func(r valkey.ValkeyResult, n int) []transport.Outcome[decision] {
		reqs := make([]request, n)
		for i := range reqs {
			reqs[i] = request{set: set, record: 1}
		}
		outs := make([]transport.Outcome[decision], n)
		decodeDecisions(r, reqs, outs)
		return outs
	}
	// Defaults filled in, and the Result they make: the same through either form.
	at := time.UnixMicro(1_000_000)
	want := Result{Allowed: true, Remaining: 4, ResetAfter: time.Hour, QuotaAfter: time.Second, At: at, Window: time.Second,
		Entry: EntryID{At: at, Seq: 1, Cost: 1}}
	for form, rep := range map[string]valkey.ValkeyResult{
		"single": reply(single(1_000_000, 4)), "batch": reply("1000000", dec(4)),
	} {
		o := read(rep, 1)[0]
		if r := set.result(o.Reply, "", 1); o.Invalid != nil || !o.Recorded || r != want {
			t.Fatalf("a short %s reply: %+v, %v; want %+v", form, r, o.Invalid, want)
		}
	}
	// One request's error reply is its own, and so is a value no script gives: the requests
	// after it are read all the same.
	outs := read(reply("1000000", "err:BADLAYOUT the key holds a hash, not a strictrate log", single(0, 4), dec(2, 250)), 3)
	if outs[0].Err == nil || !strings.HasPrefix(outs[0].Err.Error(), "BADLAYOUT") || outs[0].Invalid != nil ||
		outs[1].Invalid == nil || outs[1].Err != nil ||
		outs[2].Err != nil || outs[2].Invalid != nil || outs[2].Reply.retryAfter != 250 || outs[2].Recorded {
		t.Fatalf("an error reply, a bad value, then a denial: %+v; want BADLAYOUT for the first, the second invalid, a denial with retryAfter 250 for the third", outs)
	}
	for name, vals := range map[string][]string{
		"empty string":            {""},
		"no decision":             {be8(1_000_000)},
		"count 0":                 {single(1_000_000)},
		"count 7":                 {single(1_000_000, 1, 0, 1, 1, 1, 1, 1)},
		"count past the end":      {single(1_000_000, 1, 0, 1)[:8+1+8*3-1]},
		"a byte left over":        {single(1_000_000, 4) + "x"},
		"no server now":           {single(0, 4)},
		"batch: too few values":   {"1000000"},
		"batch: a value too many": {"1000000", dec(4), dec(4)},
		"batch: a number":         {"1000000", "1000000"},
		"batch: no now":           {"0", dec(4)},
	} {
		if o := read(reply(vals...), 1)[0]; o.Invalid == nil || o.Recorded {
			t.Errorf("%s: read as %+v, want a reply error", name, o)
		}
	}
	for name, vals := range map[string][]int64{
		"seq 0":              {6, 1, 0, 3, 3, 1, 0},
		"negative remaining": {1, -1},
		"negative retry":     {2, 0, -5},
		"negative quota":     {3, 0, 5, -2},
		"quota after reset":  {4, 0, 5, 11, 10},
		"negative reset":     {4, 0, 5, 1, -1},
		"limit position 0":   {5, 0, 5, 10, 10, 0},
		"limit position 3":   {5, 0, 5, 10, 10, 3},
	} {
		// A well-formed decision of values no script gives: refused as it is read.
		if o := read(reply(single(7, vals[1:]...)), 1)[0]; o.Invalid == nil || !strings.Contains(o.Invalid.Error(), "script reply") {
			t.Errorf("%s: read %+v, want a reply error", name, o.Reply)
		}
	}
	// The whole call's error reply is left to the transport, which hands it each request.
	for _, o := range read(valkey.NewErrorResult(fmt.Errorf("connection reset")), 2) {
		if o.Err != nil || o.Invalid != nil || o.Recorded {
			t.Errorf("transport error: %+v, want nothing read", o)
		}
	}
}

func TestClockReadingRefusesTimesOutOfRange(t *testing.T) {
	for _, tc := range []struct {
		t  time.Time
		ok bool
	}{
		{time.Unix(0, 0), true},
		{time.Date(2100, 1, 1, 0, 0, 0, 0, time.UTC), true},
		{time.Date(1850, 1, 1, 0, 0, 0, 0, time.UTC), true},
		{time.Time{}, false},
		{time.Date(2113, 1, 1, 0, 0, 0, 0, time.UTC), false},
	} {
		_, err := clockReading{t: tc.t, set: true}.micros()
		if (err == nil) != tc.ok {
			t.Errorf("micros(%s) err = %v, want ok=%v", tc.t, err, tc.ok)
		}
	}
}

// The server's clock in a single decision's argument is decide.lua's SERVER_CLOCK.
func TestServerClockIsTheScripts(t *testing.T) {
	m := regexp.MustCompile(`(?m)^--const SERVER_CLOCK (\d+)$`).FindStringSubmatch(scripts.Source("decide"))
	if m == nil {
		t.Fatal("decide.lua defines no SERVER_CLOCK")
	}
	if got, _ := strconv.ParseInt(m[1], 10, 64); got != serverClock {
		t.Fatalf("decide.lua's SERVER_CLOCK is %d, want the engine's %d", got, serverClock)
	}
}
