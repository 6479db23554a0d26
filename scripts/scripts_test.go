package scripts

import (
	"context"
	"crypto/sha1"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"io/fs"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"testing/fstest"

	"github.com/google/uuid"
	"github.com/valkey-io/valkey-go"

	"github.com/strictrate/strictrate/internal/valkeytest"
)

var server *valkeytest.Server

// The tests that decide on a caller's clock move it only as they say, but the scripts make a
// key live from the server's own time (as long as the caller's clock says the key is needed):
// so their windows and leases last an hour, and no pause of a busy machine between two calls
// lets the server drop a key the test still reads (TestLeaseScriptsRun failed so once).

func TestMain(m *testing.M) {
	os.Exit(valkeytest.RunWithServer(m, func(s *valkeytest.Server) { server = s }))
}

// all is every script Source composes, by file name, as the engine reads it.
var all = func() map[string]func() string {
	m := map[string]func() string{}
	for _, name := range scriptFiles {
		if name != "probe.lua" {
			m[name] = func() string { return Source(strings.TrimSuffix(name, ".lua")) }
		}
	}
	return m
}()

// layout is the one layout version the scripts write and read (lib_log.lua's LAYOUT), as
// inspect.lua reports it.
var layout = func() int64 {
	m := regexp.MustCompile(`(?m)^--const LAYOUT (\d+)$`).FindStringSubmatch(Source("inspect"))
	if m == nil {
		panic("lib_log.lua defines no LAYOUT")
	}
	v, _ := strconv.ParseInt(m[1], 10, 64)
	return v
}()

// The scripts know one layout of at most five header kinds: each a constant KIND_ of
// lib_log.lua, each a distinct byte, and no script tests a kind byte but through them.
func TestOneLayoutOfFewKinds(t *testing.T) {
	text, err := files.ReadFile("lib_log.lua")
	if err != nil {
		t.Fatal(err)
	}
	kinds := regexp.MustCompile(`(?m)^--const KIND_([A-Z]) (\d+)$`).FindAllStringSubmatch(string(text), -1)
	if len(kinds) == 0 || len(kinds) > 5 {
		t.Fatalf("lib_log.lua defines %d header kinds, want 1 to 5", len(kinds))
	}
	seen := map[string]bool{}
	for _, k := range kinds {
		if seen[k[2]] || k[2] != strconv.Itoa(int(k[1][0])) {
			t.Errorf("KIND_%s is %s: want its letter's byte, once", k[1], k[2])
		}
		seen[k[2]] = true
	}
	if n := len(regexp.MustCompile(`(?m)^--const LAYOUT `).FindAllString(string(text), -1)); n != 1 || layout <= 0 {
		t.Fatalf("lib_log.lua defines LAYOUT %d times (%d), want once", n, layout)
	}
}

// Composition replaces every include line with its part, and each constant's name in code
// with its value; nothing else changes.
func TestComposeInlinesParts(t *testing.T) {
	for name, source := range all {
		src := source()
		if strings.Contains(src, includePrefix) {
			t.Errorf("%s still has an include line after composition", name)
		}
		raw, err := files.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(string(raw), "\n") {
			part, ok := strings.CutPrefix(line, includePrefix)
			if !ok {
				continue
			}
			text, err := files.ReadFile(part)
			if err != nil {
				t.Fatalf("%s includes %s: %v", name, part, err)
			}
			// The part's text, the parts it includes in turn written in place.
			var expanded strings.Builder
			if err := expandIncludes(&expanded, files, part, string(text), 1, map[string]string{}); err != nil {
				t.Fatalf("%s includes %s: %v", name, part, err)
			}
			values, err := constantsOf(src) // a part may use the constants another part defines
			if err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(src, applyConstants(expanded.String(), values)) {
				t.Errorf("%s does not contain the text of %s", name, part)
			}
		}
		if len(src) <= len(raw) {
			t.Errorf("%s composed is %d bytes, no longer than its file (%d): no part was inlined", name, len(src), len(raw))
		}
	}
	// No line of code still names a constant; the comments that define them still do.
	constant := regexp.MustCompile(`\b(OPEN_CHUNK_MAX|MAX_CURSORS|NO_TIME_BEFORE|NO_TIME_AFTER|KIND_[A-Z])\b`)
	src := Source("decide")
	for _, line := range strings.Split(src, "\n") {
		if !strings.HasPrefix(strings.TrimSpace(line), "--") && constant.MatchString(line) {
			t.Errorf("decide.lua composed still names a constant: %q", line)
		}
	}
	if !strings.Contains(src, "\n--const OPEN_CHUNK_MAX 32\n") || !strings.Contains(src, "count >= 32 ") {
		t.Error("decide.lua composed lacks OPEN_CHUNK_MAX's definition or its value in the code")
	}
	for _, bad := range []string{"--const lower 1\n", "--const NOVALUE\n", "--const TWICE 1\n--const TWICE 2\n"} {
		if _, err := substituteConstants(bad); err == nil {
			t.Errorf("constants %q accepted", bad)
		}
	}
	if _, err := compose("no_such_script.lua"); err == nil {
		t.Error("compose of a missing file succeeded")
	}
}

// A part may include parts, one level deep: the nested part's text lands in place, its
// constants apply to the whole script, and composition refuses a part that a part includes
// when it includes another, a part included twice in one script, and a nested part that
// carries a shebang line.
func TestComposeNestsPartsOneLevel(t *testing.T) {
	fsys := fstest.MapFS{
		"script.lua": {Data: []byte("#!lua flags=no-writes\n-- include: outer.lua\nreturn f()\n")},
		"outer.lua":  {Data: []byte("local function f()\n-- include: inner.lua\nend\n")},
		"inner.lua":  {Data: []byte("--const WIDTH 2\nreturn WIDTH\n")},

		"deep.lua":       {Data: []byte("-- include: outer_deep.lua\n")},
		"outer_deep.lua": {Data: []byte("-- include: inner_deep.lua\n")},
		"inner_deep.lua": {Data: []byte("-- include: inner.lua\n")},

		"twice.lua": {Data: []byte("-- include: outer.lua\n-- include: inner.lua\n")},

		"flagged.lua":       {Data: []byte("-- include: outer_flagged.lua\n")},
		"outer_flagged.lua": {Data: []byte("-- include: inner_flagged.lua\n")},
		"inner_flagged.lua": {Data: []byte("#!lua flags=no-writes\nreturn 1\n")},
	}
	got, err := composeFrom(fsys, "script.lua", nil)
	if err != nil {
		t.Fatal(err)
	}
	if want := "#!lua flags=no-writes\nlocal function f()\n--const WIDTH 2\nreturn 2\nend\nreturn f()\n"; got != want {
		t.Fatalf("composed\n%q\nwant\n%q", got, want)
	}
	if got, err := composeFrom(fsys, "script.lua", map[string]string{"WIDTH": "3"}); err != nil || !strings.Contains(got, "return 3\n") {
		t.Fatalf("a nested part's constant set to 3: %q, %v", got, err)
	}
	for name, want := range map[string]string{
		"deep.lua":    "parts nest one level",
		"twice.lua":   "include each part once",
		"flagged.lua": "carries a shebang line",
	} {
		if _, err := composeFrom(fsys, name, nil); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s composed with error %v, want one that says %q", name, err, want)
		}
	}
}

// Only settle.lua reaches the refunds' functions (find, compact: lib_refund.lua), so only it
// makes them; every script that reads a log has the general path's, which the decisions
// reach.
func TestRefundsComposedIntoSettleAlone(t *testing.T) {
	for name, source := range all {
		src := source()
		refunds := strings.Contains(src, "function g.find(") && strings.Contains(src, "function g.compact(")
		if refunds != (name == "settle.lua") {
			t.Errorf("%s composed with the refunds' functions: %v, want %v", name, refunds, name == "settle.lua")
		}
		if strings.Contains(src, "local function general()") && !strings.Contains(src, "function g.set_cost(") {
			t.Errorf("%s has general() without the edits merge_slot and insert make (set_cost)", name)
		}
	}
}

// maxLuaLines is the most lines a Lua file holds: one concept per file, small enough to read
// in one sitting.
const maxLuaLines = 400

func TestLuaFilesAreSmall(t *testing.T) {
	names, err := fs.Glob(files, "*.lua")
	if err != nil || len(names) == 0 {
		t.Fatalf("no Lua files embedded: %v", err)
	}
	for _, name := range names {
		text, err := files.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		if n := strings.Count(string(text), "\n"); n > maxLuaLines {
			t.Errorf("%s is %d lines, more than %d: split it along its concepts", name, n, maxLuaLines)
		}
	}
}

// The composed text is what the server runs: it loads, the server names it by the SHA-1 of
// that text, and it behaves as a limit: Max admitted, the next one denied with a wait.
func TestComposedScriptsRun(t *testing.T) {
	c := server.Client(t)
	ctx := context.Background()
	for name, source := range all {
		src := source()
		sum := sha1.Sum([]byte(src))
		got, err := c.Do(ctx, c.B().ScriptLoad().Script(src).Build()).ToString()
		if err != nil {
			t.Fatalf("SCRIPT LOAD %s: %v", name, err)
		}
		if want := hex.EncodeToString(sum[:]); got != want {
			t.Fatalf("SCRIPT LOAD %s: digest %s, want %s", name, got, want)
		}
	}

	const now, window, max = 1_790_000_000_000_000, 3_600_000_000, 3
	call := func(name, key string, args ...string) valkey.ValkeyResult {
		sum := sha1.Sum([]byte(all[name]()))
		return c.Do(ctx, c.B().Evalsha().Sha1(hex.EncodeToString(sum[:])).Numkeys(1).Key(key).Arg(args...).Build())
	}
	run := func(name, key string, args ...string) []int64 {
		t.Helper()
		vals, err := call(name, key, args...).AsIntSlice()
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		return vals
	}
	settle := func(key string, args ...string) int64 {
		t.Helper()
		back, err := call("settle.lua", key, args...).AsInt64()
		if err != nil {
			t.Fatalf("settle.lua: %v", err)
		}
		return back
	}
	itoa := func(v int64) string { return strconv.FormatInt(v, 10) }
	// runDecision runs a single decision script; its reply (lib_reply.lua: a string, the
	// server's now, then the decision), flattened: the now, the count, the values.
	runDecision := func(name, key string, args ...string) []int64 {
		t.Helper()
		s, err := call(name, key, args...).ToString()
		if err != nil || len(s) < 8 {
			t.Fatalf("%s: %q, %v", name, s, err)
		}
		return append([]int64{int64(binary.BigEndian.Uint64([]byte(s)))}, unpackDecision(t, s[8:])...)
	}
	// A decision's reply (lib_reply.lua) on a caller's clock: 0 for the server's now, a count,
	// then remaining and as many more values as differ from their defaults.
	decided := func(r []int64) (remaining, retry int64) {
		t.Helper()
		if len(r) < 3 || r[0] != 0 || r[1] < 1 || int(r[1]) != len(r)-2 {
			t.Fatalf("reply %v is not one decision on a caller's clock", r)
		}
		if r[1] >= 2 {
			retry = r[3]
		}
		return r[2], retry
	}
	for name, limits := range map[string][]int64{
		"one limit":  {window, max},
		"two limits": {window / 2, max + 1, window, max},
	} {
		key := "scripts-test:" + name + ":" + uuid.NewString()
		// args is the single scripts' one argument (decide.lua): 8-byte big-endian integers, now,
		// n, the limits.
		args := func(at int64, n int) []string {
			b := binary.BigEndian.AppendUint64(nil, uint64(at))
			b = binary.BigEndian.AppendUint64(b, uint64(n))
			for _, v := range limits {
				b = binary.BigEndian.AppendUint64(b, uint64(v))
			}
			return []string{string(b)}
		}
		for i := int64(0); i < max; i++ {
			if remaining, retry := decided(runDecision("decide.lua", key, args(now+i, 1)...)); remaining != max-1-i || retry != 0 {
				t.Fatalf("%s: event %d: %d remaining, retry after %d; want admitted with %d remaining", name, i+1, remaining, retry, max-1-i)
			}
		}
		if remaining, retry := decided(runDecision("decide.lua", key, args(now+max, 1)...)); remaining != 0 || retry != window-max {
			t.Fatalf("%s: event %d: %d remaining, retry after %d; want denied, 0 remaining, retry after %d", name, max+1, remaining, retry, window-max)
		}
		if remaining, retry := decided(runDecision("peek.lua", key, args(now+max, 1)...)); remaining != 0 || retry != window-max {
			t.Fatalf("%s: peek after %d events: %d remaining, retry after %d; want 0 remaining, retry after %d", name, max, remaining, retry, window-max)
		}
		// The second event is refunded: its room comes back at once, and its entry, alone in
		// its microsecond and older than the newest, leaves the log; a second refund gives
		// nothing more.
		if got := settle(key, itoa(now+1), "1", "1", "0"); got != 1 {
			t.Fatalf("%s: refund: %d events back, want 1", name, got)
		}
		if got := settle(key, itoa(now+1), "1", "1", "0"); got != 0 {
			t.Fatalf("%s: second refund: %d events back, want none", name, got)
		}
		log := run("inspect.lua", key, "0")
		// The refund writes the header the general path writes, in the one layout: a small one
		// for one limit, a full one that keeps the shorter window's cursor for two.
		want := []int64{max - 1, max - 1, layout, log[3], 0, now, 1, now + 2, 1}
		if fmt.Sprint(log) != fmt.Sprint(want) {
			t.Fatalf("%s: inspect: %v, want %v", name, log, want)
		}
		if remaining, retry := decided(runDecision("decide.lua", key, args(now+max, 1)...)); remaining != 0 || retry != 0 {
			t.Fatalf("%s: after the refund: %d remaining, retry after %d; want admitted with 0 remaining", name, remaining, retry)
		}
	}
}

// unpackDecision reads a decision as lib_reply.lua encodes it (a count c, then c values of
// 8 bytes, big-endian), flattened: the count, then the values.
func unpackDecision(t *testing.T, s string) []int64 {
	t.Helper()
	if len(s) == 0 || len(s) != 1+8*int(s[0]) {
		t.Fatalf("decision %q: not a count and that many values", s)
	}
	vals := []int64{int64(s[0])}
	for i := 1; i < len(s); i += 8 {
		vals = append(vals, int64(binary.BigEndian.Uint64([]byte(s[i:i+8]))))
	}
	return vals
}

// A batch decides in KEYS order, the same key twice in turn, and a decision that fails (its
// key holds a string) fails alone.
func TestBatchDecidesInOrderAndIsolatesFailures(t *testing.T) {
	c := server.Client(t)
	ctx := context.Background()
	id := uuid.NewString()
	poisoned := "scripts-test:batch:poisoned:" + id
	if err := c.Do(ctx, c.B().Set().Key(poisoned).Value("not a log").Build()).Error(); err != nil {
		t.Fatal(err)
	}
	a, b := "scripts-test:batch:a:"+id, "scripts-test:batch:b:"+id
	keys := []string{a, poisoned, a, b, a}
	// The server's clock for all; set 1: 2 per second; set 2: 5 per ms and 4 per minute.
	args := []string{"", "2", "2", "1000000", "2", "4", "1000", "5", "60000000", "4"}
	for _, k := range keys {
		if k == b {
			args = append(args, "3", "2") // cost 3, set 2
		} else {
			args = append(args, "1", "1") // cost 1, set 1
		}
	}
	sum := sha1.Sum([]byte(Source("decide_batch")))
	got, err := c.Do(ctx, c.B().Evalsha().Sha1(hex.EncodeToString(sum[:])).Numkeys(int64(len(keys))).Key(keys...).Arg(args...).Build()).ToArray()
	if err != nil {
		t.Fatal(err)
	}
	var flat []string
	for _, m := range got {
		if err := m.Error(); err != nil {
			if !strings.HasPrefix(err.Error(), "BADLAYOUT the key holds a string") {
				t.Fatalf("an error reply other than BADLAYOUT for a string: %v", err)
			}
			flat = append(flat, "BADLAYOUT")
			continue
		}
		if v, err := m.AsInt64(); err == nil {
			flat = append(flat, strconv.FormatInt(v, 10)) // the now
			continue
		}
		d, err := m.ToString()
		if err != nil {
			t.Fatal(err)
		}
		for _, v := range unpackDecision(t, d) {
			flat = append(flat, strconv.FormatInt(v, 10))
		}
	}
	// now; a: 1 left; the poisoned key; a: 0 left, the second entry of that microsecond (seq
	// 2); b: 1 left, the minute binding (position 2); a: denied, until the first entry leaves
	// one second later (one instant for the whole batch). Each quota_after is when the first
	// entry of the named window leaves: a's first entry, b's only one.
	want := []string{flat[0], "1", "1", "BADLAYOUT", "6", "0", "0", "1000000", "1000000", "1", "2",
		"5", "1", "0", "60000000", "60000000", "2", "2", "0", "1000000"}
	if strings.Join(flat, " ") != strings.Join(want, " ") {
		t.Fatalf("batch reply\n got %v\nwant %v", flat, want)
	}
}

// The lease scripts as the server runs them, on a caller's clock: max leases granted, the
// next denied until the soonest expires, an extended lease outlives its first expiry, an
// expired one cannot be extended, and a release removes only its own lease. The key lives ttl
// from the server's now (lib_lease.lua, keep_until): hence a ttl of an hour (see server).
func TestLeaseScriptsRun(t *testing.T) {
	c := server.Client(t)
	ctx := context.Background()
	run := func(src string, key string, args ...string) valkey.ValkeyResult {
		return c.Do(ctx, c.B().Eval().Script(src).Numkeys(1).Key(key).Arg(args...).Build())
	}
	ints := func(what string, r valkey.ValkeyResult) []int64 {
		t.Helper()
		v, err := r.AsIntSlice()
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		return v
	}
	const now, ttl, max = 1_790_000_000_000_000, 3_600_000_000, 2
	itoa := func(v int64) string { return strconv.FormatInt(v, 10) }
	key := "scripts-test:leases:" + uuid.NewString()
	acquire := func(at int64, id string) []int64 {
		return ints("acquire "+id, run(Source("lease_acquire"), key, itoa(at), itoa(max), itoa(ttl), id))
	}
	if got := acquire(now, "a"); fmt.Sprint(got) != fmt.Sprint([]int64{1, now, now + ttl, 1}) {
		t.Fatalf("first lease: %v", got)
	}
	if got := acquire(now+10, "b"); fmt.Sprint(got) != fmt.Sprint([]int64{1, now + 10, now + 10 + ttl, 2}) {
		t.Fatalf("second lease: %v", got)
	}
	if got := acquire(now+20, "c"); fmt.Sprint(got) != fmt.Sprint([]int64{0, now + 20, 0, 2, now + ttl, now + 10 + ttl}) {
		t.Fatalf("third lease, key full: %v, want denied until a expires, reset when b does", got)
	}
	if err := run(Source("lease_acquire"), key, itoa(now+30), "3", itoa(ttl), "a").Error(); err == nil {
		t.Fatal("a lease id already held was accepted twice")
	}
	extend := func(at int64, id string) []int64 {
		return ints("extend "+id, run(Source("lease_extend"), key, itoa(at), itoa(ttl), id))
	}
	if got := extend(now+50, "a"); fmt.Sprint(got) != fmt.Sprint([]int64{1, now + 50, now + 50 + ttl}) {
		t.Fatalf("extend a: %v", got)
	}
	// At b's expiry b frees its slot; a, extended, still holds its own.
	if got := acquire(now+10+ttl, "c"); got[0] != 1 || got[3] != 2 {
		t.Fatalf("c at b's expiry: %v, want granted, the second of 2 holders", got)
	}
	if got := extend(now+10+ttl, "b"); fmt.Sprint(got) != fmt.Sprint([]int64{0, now + 10 + ttl}) {
		t.Fatalf("extend b after its expiry: %v, want refused", got)
	}
	for i, want := range []int64{1, 0} {
		n, err := run(Source("lease_release"), key, "c").AsInt64()
		if err != nil || n != want {
			t.Fatalf("release c, time %d: %d, %v; want %d", i+1, n, err, want)
		}
	}
	members, err := c.Do(ctx, c.B().Zrange().Key(key).Min("0").Max("-1").Build()).AsStrSlice()
	if err != nil || fmt.Sprint(members) != "[a]" {
		t.Fatalf("leases left: %v, %v; want [a]", members, err)
	}
}

// The batch scripts open with their flags (the server reads a shebang only as the first line):
// allow-cross-slot-keys, and no-writes for the read-only one; composition keeps that line
// first, and no other script carries one. Their keys may be passed in ARGV instead of declared
// (numkeys 0, their number first: lib_keys.lua), which a cluster's batch of several slots of
// one node needs; the decisions are then the same, and EVALSHA_RO runs the peeks.
func TestBatchScriptsCarryFlagsAndTakeKeysInArgv(t *testing.T) {
	flags := map[string]string{
		"decide_batch.lua": "#!lua flags=allow-cross-slot-keys\n",
		"peek_batch.lua":   "#!lua flags=allow-cross-slot-keys,no-writes\n",
		"decide_all.lua":   "#!lua flags=allow-cross-slot-keys\n",
	}
	for name, source := range all {
		src, want := source(), flags[name]
		if want == "" {
			if strings.Contains(src, shebangPrefix) {
				t.Errorf("%s carries a shebang", name)
			}
			continue
		}
		if !strings.HasPrefix(src, want) || strings.Count(src, shebangPrefix) != 1 {
			t.Errorf("%s composed opens with %q, want its flags line %q first and only there", name, src[:min(len(src), 60)], want)
		}
	}

	c := server.Client(t)
	ctx := context.Background()
	sha := func(src string) string {
		sum := sha1.Sum([]byte(src))
		return hex.EncodeToString(sum[:])
	}
	for _, src := range []string{Source("decide_batch"), Source("peek_batch")} {
		if err := c.Do(ctx, c.B().ScriptLoad().Script(src).Build()).Error(); err != nil {
			t.Fatal(err)
		}
	}
	const now = 1_790_000_000_000_000
	// The caller's clock for each request; one set: 2 per hour; four requests, the first key
	// twice, the last of cost 2.
	decisions := func(declared bool, script string, keys []string) []string {
		t.Helper()
		args := []string{"each", "1", "2", "3600000000", "2"}
		for i := range keys {
			cost := "1"
			if i == len(keys)-1 {
				cost = "2"
			}
			args = append(args, cost, "1", strconv.Itoa(now+i))
		}
		var cmd valkey.Completed
		switch {
		case declared && script == "decide":
			cmd = c.B().Evalsha().Sha1(sha(Source("decide_batch"))).Numkeys(int64(len(keys))).Key(keys...).Arg(args...).Build()
		case script == "decide":
			cmd = c.B().Evalsha().Sha1(sha(Source("decide_batch"))).Numkeys(0).Arg(strconv.Itoa(len(keys))).Arg(keys...).Arg(args...).Build()
		default:
			cmd = c.B().EvalshaRo().Sha1(sha(Source("peek_batch"))).Numkeys(0).Arg(strconv.Itoa(len(keys))).Arg(keys...).Arg(args...).Build()
		}
		got, err := c.Do(ctx, cmd).ToArray()
		if err != nil {
			t.Fatalf("%s (declared %v): %v", script, declared, err)
		}
		var flat []string
		for _, m := range got {
			s, err := m.ToString()
			if err != nil {
				v, _ := m.AsInt64()
				s = strconv.FormatInt(v, 10)
			}
			flat = append(flat, strconv.Quote(s))
		}
		return flat
	}
	id := uuid.NewString()
	declared := []string{"scripts-test:argv:a:" + id, "scripts-test:argv:b:" + id, "scripts-test:argv:a:" + id, "scripts-test:argv:c:" + id}
	inArgv := []string{"scripts-test:argv:x:" + id, "scripts-test:argv:y:" + id, "scripts-test:argv:x:" + id, "scripts-test:argv:z:" + id}
	want := decisions(true, "decide", declared)
	if got := decisions(false, "decide", inArgv); strings.Join(got, " ") != strings.Join(want, " ") {
		t.Fatalf("decisions with the keys in ARGV\n got %v\nwant %v (declared)", got, want)
	}
	// The peeks see what the decisions recorded: the same for both sets of keys.
	if got, want := decisions(false, "peek", inArgv), decisions(false, "peek", declared); strings.Join(got, " ") != strings.Join(want, " ") {
		t.Fatalf("peeks with the keys in ARGV\n got %v\nwant %v", got, want)
	}
	for _, k := range inArgv[:2] {
		if n, err := c.Do(ctx, c.B().Exists().Key(k).Build()).AsInt64(); err != nil || n != 1 {
			t.Fatalf("key %s passed in ARGV: EXISTS %d, %v; want the decision recorded", k, n, err)
		}
	}
}

// decide_all.lua peeks every request and records the ones with room only when every request
// that is not advisory has room: one without room denies the call, which records nothing; an
// advisory one without room is left out alone; a cost of 0 is judged and never recorded; and
// "check" records nothing whatever the room.
func TestDecideAllRecordsAllOrNothing(t *testing.T) {
	c := server.Client(t)
	ctx := context.Background()
	id := uuid.NewString()
	full, a, b := "scripts-test:all:full:"+id, "scripts-test:all:a:"+id, "scripts-test:all:b:"+id
	const now = 1_790_000_000_000_000
	// One set: 2 per hour. The full key holds 2 events.
	set := []string{"1", "2", "3600000000", "2"}
	call := func(mode string, keys []string, reqs ...string) []string {
		t.Helper()
		args := append(append([]string{}, set...), "1", strconv.Itoa(now), mode, strconv.Itoa(len(keys)))
		args = append(args, reqs...)
		got, err := c.Do(ctx, c.B().Eval().Script(Source("decide_all")).Numkeys(int64(len(keys))).Key(keys...).Arg(args...).Build()).ToArray()
		if err != nil {
			t.Fatalf("decide_all %s %v: %v", mode, reqs, err)
		}
		flat := []string{}
		for i, m := range got {
			switch i {
			case 0:
				v, _ := m.AsInt64()
				flat = append(flat, strconv.FormatInt(v, 10))
			case 1:
				s, _ := m.ToString()
				flat = append(flat, s)
			default:
				s, err := m.ToString()
				if err != nil {
					t.Fatalf("decision %d: %v", i-1, err)
				}
				flat = append(flat, fmt.Sprint(unpackDecision(t, s)))
			}
		}
		return flat
	}
	events := func(key string) int64 {
		t.Helper()
		return evalInts(t, c, Source("inspect"), key, "0")[0]
	}
	call("decide", []string{full}, "2", "1", "0")
	// a has room, full has none: nothing is recorded; a's peek says 2 left (no event: quota
	// and reset 0), full's is denied until its events leave.
	got := call("decide", []string{a, full}, "1", "1", "0", "1", "1", "0")
	want := []string{"0", "00", "[4 2 0 0 0]", "[2 0 3600000000]"}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("denied call: %v, want %v", got, want)
	}
	if events(a) != 0 {
		t.Fatalf("denied call recorded %d events on a", events(a))
	}
	// full advisory: a and b (of cost 2) are recorded, full is left out.
	got = call("decide", []string{a, full, b}, "1", "1", "0", "1", "1", "1", "2", "1", "0")
	want = []string{"0", "101", "[1 1]", "[2 0 3600000000]", "[1 0]"}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("advisory call: %v, want %v", got, want)
	}
	if events(a) != 1 || events(b) != 2 || events(full) != 2 {
		t.Fatalf("events a %d, b %d, full %d; want 1, 2, 2", events(a), events(b), events(full))
	}
	got = call("decide", []string{a}, "0", "1", "0")
	if want := []string{"0", "0", "[1 1]"}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("a cost of 0: %v, want %v", got, want)
	}
	got = call("check", []string{a}, "1", "1", "0")
	if want := []string{"0", "0", "[1 1]"}; fmt.Sprint(got) != fmt.Sprint(want) || events(a) != 1 {
		t.Fatalf("check: %v (a holds %d), want %v and nothing recorded", got, events(a), want)
	}
}

// decide_all.lua decides the groups of one call one after the other, each all or nothing on
// its own: a group sees what the groups before it recorded on a key they share, a denied
// group records nothing while the groups around it do, a group that fails (its key holds a
// string) fails alone, and groups on the server's clock share one reading while a group with
// its own now keeps it.
func TestDecideAllGroupsInOneCall(t *testing.T) {
	c := server.Client(t)
	ctx := context.Background()
	id := uuid.NewString()
	a, b, poisoned := "scripts-test:groups:a:"+id, "scripts-test:groups:b:"+id, "scripts-test:groups:poisoned:"+id
	if err := c.Do(ctx, c.B().Set().Key(poisoned).Value("not a log").Build()).Error(); err != nil {
		t.Fatal(err)
	}
	const now = 1_790_000_000_000_000
	// One set: 2 per hour.
	args := []string{"1", "2", "3600000000", "2", "5"}
	group := func(now, mode string, reqs ...string) {
		args = append(args, now, mode, strconv.Itoa(len(reqs)/3))
		args = append(args, reqs...)
	}
	keys := []string{}
	at := strconv.Itoa(now)
	group(at, "decide", "1", "1", "0", "1", "1", "0") // a, b: both recorded, 1 left each
	keys = append(keys, a, b)
	group(at, "decide", "2", "1", "0", "1", "1", "0") // a (2, no room), b: denied, nothing
	keys = append(keys, a, b)
	group(at, "decide", "1", "1", "0") // a: the last one
	keys = append(keys, a)
	group("", "decide", "1", "1", "0", "1", "1", "0") // poisoned fails, b not recorded
	keys = append(keys, poisoned, b)
	group("", "decide", "1", "1", "0") // b on the server's clock: a log of another time, its own room
	keys = append(keys, "scripts-test:groups:c:"+id)
	got, err := c.Do(ctx, c.B().Eval().Script(Source("decide_all")).Numkeys(int64(len(keys))).Key(keys...).Arg(args...).Build()).ToArray()
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1+3+3+2+3+2 {
		t.Fatalf("reply of %d values, want 13: %v", len(got), got)
	}
	serverNow, err := got[0].AsInt64()
	if err != nil || serverNow < now-1_000_000_000_000 {
		t.Fatalf("server's now %d (%v): want the server's clock, read for the groups without a now", serverNow, err)
	}
	flags := func(i int) string {
		s, err := got[i].ToString()
		if err != nil {
			t.Fatalf("value %d: %v", i, err)
		}
		return s
	}
	remaining := func(i int) int64 {
		return unpackDecision(t, flags(i))[1]
	}
	if f := flags(1); f != "11" || remaining(2) != 1 || remaining(3) != 1 {
		t.Errorf("group 1: flags %q, remaining %d and %d; want 11, 1 and 1", f, remaining(2), remaining(3))
	}
	if f := flags(4); f != "00" || remaining(5) != 1 || remaining(6) != 1 {
		t.Errorf("group 2: flags %q, remaining %d and %d; want 00 and the room the first group left (1, 1)", f, remaining(5), remaining(6))
	}
	if f := flags(7); f != "1" || remaining(8) != 0 {
		t.Errorf("group 3: flags %q, remaining %d; want 1 and 0", f, remaining(8))
	}
	if f := flags(9); f != "00" || got[10].Error() == nil {
		t.Errorf("group 4: flags %q, first decision error %v; want 00 and its key's error", f, got[10].Error())
	}
	if f := flags(12); f != "1" || remaining(13) != 1 {
		t.Errorf("group 5: flags %q, remaining %d; want 1 and 1", f, remaining(13))
	}
	for key, want := range map[string]int64{a: 2, b: 1} {
		if n := evalInts(t, c, Source("inspect"), key, strconv.Itoa(now))[0]; n != want {
			t.Errorf("%s holds %d events, want %d", key, n, want)
		}
	}
}

// evalInts evaluates src on key with args and returns its reply as integers.
func evalInts(t *testing.T, c valkey.Client, src, key string, args ...string) []int64 {
	t.Helper()
	vals, err := c.Do(context.Background(), c.B().Eval().Script(src).Numkeys(1).Key(key).Arg(args...).Build()).AsIntSlice()
	if err != nil {
		t.Fatal(err)
	}
	return vals
}
