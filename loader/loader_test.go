package loader_test

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"

	"github.com/valkey-io/valkey-go"

	"github.com/strictrate/strictrate/internal/valkeytest"
	"github.com/strictrate/strictrate/loader"
	"github.com/strictrate/strictrate/scripts"
)

// commandCalls reads INFO commandstats: calls per command name, e.g. "evalsha".
func commandCalls(t *testing.T, c valkey.Client) map[string]int {
	t.Helper()
	info, err := valkeytest.ReadInfo(context.Background(), c, "commandstats")
	if err != nil {
		t.Fatal(err)
	}
	calls := map[string]int{}
	for name, st := range info.CommandStats() {
		calls[name] = int(st.Calls)
	}
	return calls
}

func do(t *testing.T, c valkey.Client, cmd valkey.Completed) {
	t.Helper()
	if err := c.Do(context.Background(), cmd).Error(); err != nil {
		t.Fatal(err)
	}
}

func TestPreloadLoadsEveryScript(t *testing.T) {
	c := valkeytest.New(t).Client(t)
	ctx := context.Background()
	a := loader.New("decide", scripts.Source("decide"))
	b := loader.NewReadOnly("peek", scripts.Source("peek"))
	do(t, c, c.B().ScriptFlush().Build())

	if err := loader.Preload(ctx, c, a, b); err != nil {
		t.Fatalf("Preload: %v", err)
	}
	exists, err := c.Do(ctx, c.B().ScriptExists().Sha1(a.SHA1(), b.SHA1()).Build()).AsIntSlice()
	if err != nil {
		t.Fatal(err)
	}
	if len(exists) != 2 || exists[0] != 1 || exists[1] != 1 {
		t.Fatalf("SCRIPT EXISTS after Preload = %v, want [1 1]", exists)
	}
	if a.ReadOnly() || !b.ReadOnly() {
		t.Fatalf("handles: New read-only %v, NewReadOnly read-only %v", a.ReadOnly(), b.ReadOnly())
	}
}

// EVALSHA runs on the hot path; EVAL goes out only after NOSCRIPT, once per flush.
func TestExecUsesEvalshaAndEvalOnlyAfterNoscript(t *testing.T) {
	c := valkeytest.New(t, valkeytest.OwnServer()).Client(t)
	ctx := context.Background()
	s := loader.New("echo", "return tonumber(ARGV[1]) + 1")
	ro := loader.NewReadOnly("echo_ro", "return tonumber(ARGV[1]) + 2")
	if err := loader.Preload(ctx, c, s, ro); err != nil {
		t.Fatal(err)
	}
	exec := func(script *loader.Script, arg, want int64) {
		t.Helper()
		reply, _ := script.Exec(ctx, c, loader.Call{Args: []string{strconv.FormatInt(arg, 10)}})
		got, err := reply.AsInt64()
		if err != nil || got != want {
			t.Fatalf("%s(%d) = %d, %v; want %d", script.SHA1(), arg, got, err, want)
		}
	}
	do(t, c, c.B().ConfigResetstat().Build())

	exec(s, 1, 2)
	exec(ro, 1, 3)
	calls := commandCalls(t, c)
	if calls["evalsha"] != 1 || calls["evalsha_ro"] != 1 || calls["eval"] != 0 || calls["eval_ro"] != 0 {
		t.Fatalf("preloaded: command calls %v, want one evalsha, one evalsha_ro, no eval", calls)
	}

	do(t, c, c.B().ScriptFlush().Build())
	exec(s, 5, 6)
	exec(ro, 5, 7)
	exec(s, 7, 8)
	exec(ro, 7, 9)
	calls = commandCalls(t, c)
	if calls["evalsha"] != 3 || calls["eval"] != 1 || calls["evalsha_ro"] != 3 || calls["eval_ro"] != 1 {
		t.Fatalf("after SCRIPT FLUSH: command calls %v, want evalsha 3, eval 1, evalsha_ro 3, eval_ro 1", calls)
	}
}

// A server that refuses scripting fails Preload with ErrPreload and the server's reason.
func TestPreloadFailsWhenScriptingIsRefused(t *testing.T) {
	srv := valkeytest.New(t, valkeytest.OwnServer())
	c := srv.NewUser(t, "noscripts", "secret", "+@all", "-@scripting")

	err := loader.Preload(context.Background(), c, loader.New("decide", scripts.Source("decide")))
	if !errors.Is(err, loader.ErrPreload) || !strings.Contains(err.Error(), "NOPERM") || !strings.Contains(err.Error(), "decide") {
		t.Fatalf("Preload without scripting permission: %v, want ErrPreload naming the script and NOPERM", err)
	}
	if err := loader.Preload(context.Background(), nil); !errors.Is(err, loader.ErrPreload) {
		t.Fatalf("Preload(nil client) = %v, want ErrPreload", err)
	}
}

// Exec with Then sends the commands behind the script in one round trip and hands back every
// reply in order, after NOSCRIPT too (when all of them go again).
func TestExecThenReturnsEveryReply(t *testing.T) {
	c := valkeytest.New(t, valkeytest.OwnServer()).Client(t)
	ctx := context.Background()
	s := loader.New("incr", "return redis.call('INCR', KEYS[1])")
	then := func(b valkey.Builder) []valkey.Completed {
		return []valkey.Completed{b.Wait().Numreplicas(0).Timeout(1).Build(), b.Get().Key("n").Build()}
	}
	for _, want := range []int64{1, 2} { // the first after NOSCRIPT: nothing was preloaded
		got, after := s.Exec(ctx, c, loader.Call{Keys: []string{"n"}, Then: then})
		n, err := got.AsInt64()
		if err != nil || n != want || len(after) != 2 {
			t.Fatalf("ExecThen: script %d, %v, %d replies after; want %d and 2", n, err, len(after), want)
		}
		if waited, err := after[0].AsInt64(); err != nil || waited != 0 {
			t.Fatalf("WAIT behind the script: %d, %v", waited, err)
		}
		if read, err := after[1].AsInt64(); err != nil || read != want {
			t.Fatalf("GET behind the script: %d, %v; want %d", read, err, want)
		}
	}
	if calls := commandCalls(t, c); calls["eval"] != 1 || calls["evalsha"] != 2 || calls["wait"] != 3 {
		t.Fatalf("command calls %v: want eval 1 (after NOSCRIPT), evalsha 2, wait 3", calls)
	}
}

// Exec of an Undeclared call sends keys of several slots of one cluster node to it, on a client
// of the cluster client's Nodes() (whose command builder would panic on such keys declared),
// with the keys first in ARGV: the script reaches every one of them (its flag
// allow-cross-slot-keys lets it), EVAL follows NOSCRIPT, and Then's commands go behind on the
// same node.
func TestExecOnNodeTakesKeysOfSeveralSlots(t *testing.T) {
	valkeytest.SkipIfShort(t, "starts a cluster")
	cl := valkeytest.NewCluster(t, 3, 0)
	ctx := context.Background()
	client := cl.Client(t, valkey.ClientOption{})
	primary := cl.Primaries[1]
	node := client.Nodes()[primary.Addr]
	if node == nil {
		t.Fatalf("the cluster client knows no node %s", primary.Addr)
	}
	var keys []string
	slots := map[int]bool{}
	for i := 0; len(keys) < 4; i++ {
		k := "loader:onnode:" + strconv.Itoa(i)
		if s := valkeytest.KeySlot(k); primary.Owns(k) && !slots[s] {
			slots[s] = true
			keys = append(keys, k)
		}
	}
	func() {
		defer func() {
			if recover() == nil {
				t.Error("the node client's builder took declared keys of several slots: Undeclared's way around it is not needed")
			}
		}()
		node.B().Evalsha().Sha1("0").Numkeys(int64(len(keys))).Key(keys...).Build()
	}()

	s := loader.New("incr_all", "#!lua flags=allow-cross-slot-keys\n"+
		"local k, r = tonumber(ARGV[1]), {}\n"+
		"for i = 1, k do r[i] = redis.call('INCRBY', ARGV[1 + i], ARGV[k + 2]) end\n"+
		"return r")
	for round, want := range []int64{3, 6} { // the first after NOSCRIPT: nothing was preloaded
		reply, _ := s.Exec(ctx, node, loader.Call{Keys: keys, Args: []string{"3"}, Undeclared: true})
		got, err := reply.AsIntSlice()
		if err != nil || len(got) != len(keys) {
			t.Fatalf("round %d: Exec undeclared = %v, %v", round, got, err)
		}
		for i, v := range got {
			if v != want {
				t.Fatalf("round %d: key %s = %d, want %d", round, keys[i], v, want)
			}
		}
	}
	got, after := s.Exec(ctx, node, loader.Call{Keys: keys, Args: []string{"1"}, Undeclared: true, Then: func(b valkey.Builder) []valkey.Completed {
		return []valkey.Completed{b.Wait().Numreplicas(0).Timeout(1).Build(), b.Dbsize().Build()}
	}})
	if vals, err := got.AsIntSlice(); err != nil || len(vals) != len(keys) || vals[0] != 7 {
		t.Fatalf("Exec undeclared with Then: %v, %v; want every key at 7", vals, err)
	}
	if len(after) != 2 {
		t.Fatalf("%d replies behind the script, want 2", len(after))
	}
	// DBSIZE behind the call answers on the same node: its keys, these among them.
	if n, err := after[1].AsInt64(); err != nil || n < int64(len(keys)) {
		t.Fatalf("DBSIZE behind the script: %d, %v; want at least %d", n, err, len(keys))
	}
	stats, err := valkeytest.ReadInfo(ctx, primary.Client(), "commandstats")
	if err != nil {
		t.Fatal(err)
	}
	calls := stats.CommandStats()
	if calls["eval"].Calls != 1 || calls["evalsha"].Calls != 3 || calls["evalsha"].RejectedCalls != 0 {
		t.Fatalf("on the node: eval %+v, evalsha %+v; want one EVAL (after NOSCRIPT) and three EVALSHA", calls["eval"], calls["evalsha"])
	}
}
