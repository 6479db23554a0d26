package engine_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/valkey-io/valkey-go"

	"github.com/strictrate/strictrate/engine"
	"github.com/strictrate/strictrate/internal/enginetest"
	"github.com/strictrate/strictrate/internal/valkeytest"
)

// A server with neither an append-only file nor a replica gets one warning naming what a
// restart forgets (or ErrPersistence, or nothing); one with either, none.
func TestPersistenceCheckWarnsWhenARestartForgets(t *testing.T) {
	own := valkeytest.New(t, valkeytest.OwnServer())
	c := own.Client(t)
	var logs bytes.Buffer
	logger := slog.New(slog.NewTextHandler(&logs, nil))
	quiet := func(opts ...engine.Option) {
		t.Helper()
		logs.Reset()
		if _, err := engine.New(c, append(opts, engine.WithLogger(logger))...); err != nil || logs.Len() != 0 {
			t.Fatalf("New: %v, logged %q; want neither", err, logs.String())
		}
	}

	if _, err := engine.New(c, engine.WithLogger(logger)); err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(logs.String(), "level=WARN"); n != 1 || !strings.Contains(logs.String(), own.Addr) ||
		!strings.Contains(logs.String(), "a restart forgets them") {
		t.Fatalf("default check on a server without persistence logged %d warnings: %q; want one naming the server and what a restart forgets", n, logs.String())
	}
	if _, err := engine.New(c, engine.WithPersistenceCheck(engine.Refuse)); !errors.Is(err, engine.ErrPersistence) {
		t.Fatalf("Refuse without persistence: %v, want ErrPersistence", err)
	}
	quiet(engine.WithPersistenceCheck(engine.Ignore))
	// A user that may not run INFO is not checked.
	limited := own.NewUser(t, "noinfo", "pw", "+@all", "-info")
	if _, err := engine.New(limited, engine.WithPersistenceCheck(engine.Refuse)); err != nil {
		t.Fatalf("New without INFO permission: %v", err)
	}

	setAppendOnly := func(v string) {
		t.Helper()
		if err := c.Do(context.Background(), c.B().ConfigSet().ParameterValue().ParameterValue("appendonly", v).Build()).Error(); err != nil {
			t.Fatal(err)
		}
	}
	setAppendOnly("yes")
	quiet(engine.WithPersistenceCheck(engine.Refuse))
	setAppendOnly("no")
	replicaOf(t, own)
	quiet(engine.WithPersistenceCheck(engine.Refuse))
}

// A node that keeps the logs only in memory is warned about once per process, through the
// engine's slog logger, however many engines are made on it; the warning names the node.
func TestPersistenceWarningOncePerNode(t *testing.T) {
	own := valkeytest.New(t, valkeytest.OwnServer()) // a server (run_id) no other test warned about
	var buf bytes.Buffer
	logger := slog.New(slog.NewTextHandler(&buf, nil))
	for range 5 {
		if _, err := engine.New(own.Client(t), engine.WithLogger(logger), engine.WithPersistenceCheck(engine.Warn)); err != nil {
			t.Fatal(err)
		}
	}
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != 1 || !strings.Contains(lines[0], "level=WARN") || !strings.Contains(lines[0], own.Addr) {
		t.Fatalf("warnings after 5 engines on one node: %q, want one WARN naming %s", buf.String(), own.Addr)
	}
	// One sentence a newcomer can act on: the setting found and the option that silences it.
	msg := lines[0][strings.Index(lines[0], `msg="`)+5:]
	msg = msg[:strings.Index(msg, `"`)]
	if len(msg) > 220 || strings.Count(msg, ";") > 1 || !strings.Contains(msg, "appendonly no") || !strings.Contains(msg, "WithPersistenceCheck") {
		t.Fatalf("the warning %q: want one sentence of at most 220 characters naming appendonly no and WithPersistenceCheck", msg)
	}
	// Refusing is not warning: it still fails every New.
	if _, err := engine.New(own.Client(t), engine.WithPersistenceCheck(engine.Refuse)); err == nil {
		t.Fatal("Refuse on a node without persistence: New succeeded, want an error")
	}
}

// New refuses WithDurableAck's local fsync on a server without an append-only file, or one
// that never fsyncs it (appendfsync no), whatever the persistence check says; under everysec,
// whose WAITAOF may answer before the fsync, it warns (the default), refuses
// (Refuse) or says nothing (Ignore). It refuses arguments WAITAOF cannot
// take.
func TestNewRefusesDurableAckWithoutAppendOnly(t *testing.T) {
	everysec := valkeytest.New(t, valkeytest.AppendOnly("everysec")).Client(t)
	var logs bytes.Buffer
	logger := slog.New(slog.NewTextHandler(&logs, nil))
	if _, err := engine.New(everysec, engine.WithDurableAck(1, 0, time.Second), engine.WithLogger(logger)); err != nil ||
		strings.Count(logs.String(), "level=WARN") != 1 || !strings.Contains(logs.String(), "appendfsync everysec") {
		t.Fatalf("WithDurableAck(1, 0) under appendfsync everysec: %v, logged %q; want one warning naming it", err, logs.String())
	}
	if _, err := engine.New(everysec, engine.WithDurableAck(1, 0, time.Second), engine.WithPersistenceCheck(engine.Refuse)); !errors.Is(err, engine.ErrPersistence) ||
		!strings.Contains(err.Error(), "appendfsync everysec") {
		t.Fatalf("WithDurableAck(1, 0) under appendfsync everysec, Refuse: %v, want ErrPersistence naming it", err)
	}
	logs.Reset()
	if _, err := engine.New(everysec, engine.WithDurableAck(1, 0, time.Second), engine.WithLogger(logger),
		engine.WithPersistenceCheck(engine.Ignore)); err != nil || logs.Len() != 0 {
		t.Fatalf("WithDurableAck(1, 0) under appendfsync everysec, Ignore: %v, logged %q; want neither", err, logs.String())
	}
	never := valkeytest.New(t, valkeytest.AppendOnly("no")).Client(t)
	if _, err := engine.New(never, engine.WithDurableAck(1, 0, time.Second), engine.WithPersistenceCheck(engine.Ignore)); !errors.Is(err, engine.ErrPersistence) ||
		!strings.Contains(err.Error(), "appendfsync no") {
		t.Fatalf("WithDurableAck(1, 0) under appendfsync no: %v, want ErrPersistence naming it", err)
	}
	c := valkeytest.New(t, valkeytest.OwnServer()).Client(t)
	for _, check := range []engine.CheckLevel{engine.Warn, engine.Ignore} {
		_, err := engine.New(c, engine.WithDurableAck(1, 0, time.Second), engine.WithPersistenceCheck(check))
		if !errors.Is(err, engine.ErrPersistence) || !strings.Contains(err.Error(), "appendonly no") {
			t.Fatalf("WithDurableAck(1, 0) without an append-only file: %v, want ErrPersistence naming appendonly no", err)
		}
	}
	// Only replicas asked for: the primary's own file is not needed.
	if _, err := engine.New(c, engine.WithDurableAck(0, 1, time.Second), engine.WithPersistenceCheck(engine.Ignore)); err != nil {
		t.Fatalf("WithDurableAck(0, 1) without an append-only file: %v", err)
	}
	for _, opts := range [][]engine.Option{
		{engine.WithDurableAck(2, 0, time.Second)},
		{engine.WithDurableAck(-1, 0, time.Second)},
		{engine.WithDurableAck(1, -1, time.Second)},
		{engine.WithDurableAck(1, 0, -time.Second)},
	} {
		if _, err := engine.New(c, opts...); !errors.Is(err, engine.ErrInvalidArgument) {
			t.Fatalf("New(%d options): %v, want ErrInvalidArgument", len(opts), err)
		}
	}
}

// Without persistence, a server killed and restarted comes back empty: every key admits its
// whole window again, at once. The over-admission is everything admitted in the window before
// the crash: here 4 keys at 50 per hour, 200 admitted before, 200 more after (100 %).
func TestCrashWithoutPersistenceForgetsEveryWindow(t *testing.T) {
	valkeytest.SkipIfShort(t, "kills the server (kill -9) to see what survives")
	own := valkeytest.New(t, valkeytest.OwnServer())
	c := own.Client(t)
	e := enginetest.New(t, c)
	keys := []string{enginetest.NewKey(t), enginetest.NewKey(t), enginetest.NewKey(t), enginetest.NewKey(t)}
	l := engine.PerHour(50)

	before := fillAll(t, e, keys, l)
	enginetest.Want(t, "admitted before the crash", before, len(keys)*l.Max)
	crashAndRestart(t, own, e)
	for _, key := range keys {
		enginetest.Want(t, "events in the log after the restart", enginetest.StoredEvents(t, c, key), int64(0))
	}
	after := fillAll(t, e, keys, l)
	t.Logf("no persistence: %d admitted, kill -9, restart: %d more admitted in the same hour (%.0f %% over)",
		before, after, 100*float64(after)/float64(before))
	enginetest.Want(t, "over-admitted after the restart", after, len(keys)*l.Max)
}

// toldYes is an admission a caller was told yes of, and when the caller heard it.
type toldYes struct {
	key   string
	entry engine.EntryID
	at    time.Time
}

// admitUntilCrash has 16 goroutines admit on keys through es (their limit l far above what
// they reach) until at least admissions were told yes and at least runFor has passed, kills
// the server with SIGKILL while they go on, and restarts it on its files. It returns every
// admission told yes, how many calls failed with the crash, and when the kill was sent.
func admitUntilCrash(t *testing.T, own *valkeytest.Server, es []*engine.Engine, keys []string, l engine.Limit,
	admissions int64, runFor time.Duration) (told []toldYes, failedCalls int64, killedAt time.Time) {
	t.Helper()
	ctx := context.Background()
	started := time.Now()
	var (
		mu       sync.Mutex
		admitted atomic.Int64
		failed   atomic.Int64
		wg       sync.WaitGroup
		stop     = make(chan struct{})
	)
	for g := 0; g < 16; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			e, key := es[g%len(es)], keys[g%len(keys)]
			for {
				select {
				case <-stop:
					return
				default:
				}
				tctx, cancel := context.WithTimeout(ctx, 5*time.Second)
				r, err := e.Allow(tctx, key, l)
				heard := time.Now()
				cancel()
				if err != nil {
					failed.Add(1)
					time.Sleep(time.Millisecond)
					continue
				}
				if !r.Allowed {
					t.Errorf("denied below the limit: %+v", r)
					return
				}
				mu.Lock()
				told = append(told, toldYes{key, r.Entry, heard})
				mu.Unlock()
				admitted.Add(1)
			}
		}()
	}
	if err := valkeytest.WaitFor(ctx, 30*time.Second, "enough admissions", func() (bool, error) {
		return admitted.Load() >= admissions && time.Since(started) >= runFor, nil
	}); err != nil {
		t.Fatal(err)
	}
	killedAt = time.Now()
	crashAndRestart(t, own, es[0]) // mid-run: the goroutines are still deciding when it dies
	close(stop)
	wg.Wait()
	mu.Lock()
	defer mu.Unlock()
	return told, failed.Load(), killedAt
}

// missingFromLogs reads the keys' logs and returns the told-yes admissions they lack, and the
// events they hold. An entry is its time and its position among the key's entries of that
// microsecond: a told-yes (At, Seq) is in the log when the log holds at least Seq entries at At.
func missingFromLogs(t *testing.T, c valkey.Client, keys []string, told []toldYes) (lost []toldYes, logged int64) {
	t.Helper()
	atMicros := map[string]map[int64]int{}
	for _, key := range keys {
		log := enginetest.Log(t, c, enginetest.Prefix, key)
		atMicros[key] = map[int64]int{}
		for _, entry := range log.Entries {
			atMicros[key][entry.At.UnixMicro()]++
		}
		logged += int64(log.Events)
	}
	for _, y := range told {
		if atMicros[y.key][y.entry.At.UnixMicro()] < y.entry.Seq {
			lost = append(lost, y)
		}
	}
	return lost, logged
}

// appendHoldBack bounds how long Valkey, under appendfsync everysec, may reply to a write
// before it hands that write to the kernel: while a background fsync still runs it holds its
// append-only writes back, replying meanwhile, for up to 2 seconds (counted in whole seconds of
// its clock, then written on its next tick or event loop pass). One second more covers the
// clock's granularity and a loaded machine. It bounds what a power loss takes under everysec
// too: the writes since the last fsync, which runs about once a second, later while the
// previous one is still running.
const appendHoldBack = 3 * time.Second

// With appendonly yes (appendfsync everysec), 16 goroutines admit on a few keys for a few
// seconds and the server is killed with SIGKILL mid-run: after a restart on the same files,
// every admission a caller was told yes of before the last appendHoldBack is in the log. A
// killed process loses nothing the kernel already has, and Valkey writes the append-only file
// before it replies, except while a slow background fsync makes it hold writes back (a busy
// disk): only the admissions of those last seconds may be lost, and they are logged.
func TestCrashWithAppendOnlyKeepsEveryAdmission(t *testing.T) {
	valkeytest.SkipIfShort(t, "kills the server (kill -9) to see what survives")
	crashKeepsSettled(t, "appendonly yes, everysec", valkeytest.AppendOnly("everysec"))
}

// crashKeepsSettled starts a server with opts, has admitUntilCrash admit on it for
// appendHoldBack and 2 s more, and checks with wantOnlyRecentLost that every admission told
// yes over appendHoldBack before the kill is in the logs after the restart, of at least 1,000.
func crashKeepsSettled(t *testing.T, setting string, opts ...valkeytest.Option) {
	t.Helper()
	own := valkeytest.New(t, opts...)
	c := own.Client(t)
	es := []*engine.Engine{enginetest.New(t, c), enginetest.New(t, own.Client(t))}
	keys := []string{enginetest.NewKey(t), enginetest.NewKey(t), enginetest.NewKey(t), enginetest.NewKey(t)}
	told, failed, killedAt := admitUntilCrash(t, own, es, keys, engine.Limit{Max: 1_000_000, Window: time.Hour},
		2000, appendHoldBack+2*time.Second)
	wantOnlyRecentLost(t, setting+", kill -9", c, keys, told, failed, killedAt, 1000)
}

// wantOnlyRecentLost reads the keys' logs after a crash at killedAt and fails t unless every
// admission told yes over appendHoldBack before the crash is in them, and at least minOlder
// were (fewer would check nothing), and the logs hold every told-yes admission they were
// found to hold. It logs the figures, the admissions lost among the last ones included.
func wantOnlyRecentLost(t *testing.T, setting string, c valkey.Client, keys []string, told []toldYes, failed int64,
	killedAt time.Time, minOlder int) {
	t.Helper()
	lost, logged := missingFromLogs(t, c, keys, told)
	settled := killedAt.Add(-appendHoldBack)
	older, lostOlder := 0, 0
	for _, y := range told {
		if y.at.Before(settled) {
			older++
		}
	}
	var oldestLost time.Duration // how long before the crash the earliest lost admission was told yes
	for _, y := range lost {
		if y.at.Before(settled) {
			lostOlder++
		}
		oldestLost = max(oldestLost, killedAt.Sub(y.at))
	}
	t.Logf("%s: %d told yes (%d of them over %v before the crash), crash mid-run (%d calls failed with it), "+
		"restart: %d events in the logs; %d told-yes admissions lost (the earliest told yes %v before the crash), %d of them over %v before it",
		setting, len(told), older, appendHoldBack, failed, logged, len(lost), oldestLost.Round(time.Millisecond), lostOlder, appendHoldBack)
	if older < minOlder {
		t.Fatalf("%d admissions told yes over %v before the crash, want at least %d to check what a crash keeps", older, appendHoldBack, minOlder)
	}
	if lostOlder > 0 {
		t.Fatalf("%d of %d admissions told yes over %v before the crash are not in the logs after the restart, want none", lostOlder, older, appendHoldBack)
	}
	if logged < int64(len(told)-len(lost)) {
		t.Fatalf("%d events in the logs after the restart, want at least the %d told-yes admissions found in them", logged, len(told)-len(lost))
	}
}

// buildPreload builds testdata/<name>.c into a shared library for a server's LD_PRELOAD and
// returns its path; it skips the test without a C compiler.
func buildPreload(t *testing.T, name string) string {
	t.Helper()
	cc := valkeytest.FindTool("gcc", "cc")
	if cc == "" {
		t.Skipf("needs a C compiler (gcc or cc) on PATH to build testdata/%s.c", name)
	}
	so := filepath.Join(t.TempDir(), name+".so")
	src := filepath.Join("testdata", name+".c")
	if out, err := exec.Command(cc, "-shared", "-fPIC", "-O2", "-o", so, src, "-ldl", "-lpthread").CombinedOutput(); err != nil {
		t.Fatalf("build %s: %v\n%s", src, err, out)
	}
	return so
}

// On a slow disk (testdata/slowfsync.c makes every fsync of the append-only file take 1.5
// seconds), under appendfsync everysec, Valkey holds its writes back while the previous
// background fsync runs and replies meanwhile, so kill -9 can lose admissions told yes. It
// loses only those of the last appendHoldBack: every older one is in the log after a restart.
// How many recent ones were lost is logged (the hold-back is Valkey's, not the engine's).
func TestCrashOnSlowDiskLosesOnlyHeldBackAdmissions(t *testing.T) {
	valkeytest.SkipIfShort(t, "kills the server (kill -9) to see what survives")
	so := buildPreload(t, "slowfsync")
	crashKeepsSettled(t, "appendonly yes, everysec, fsync 1.5 s", valkeytest.AppendOnly("everysec"),
		valkeytest.ServerEnv("LD_PRELOAD="+so, "SLOWFSYNC_MS=1500"))
}

// A power loss, simulated: testdata/powerloss.c, built with the C compiler and loaded into the
// server with LD_PRELOAD, keeps the server's append-only writes in its own memory until it
// fsyncs them, so kill -9 drops what a power loss would. Under appendfsync always, and with
// WithDurableAck on it, no admission told yes is lost. Under everysec the admissions told yes
// since the last fsync are lost, about a second of them, two when the disk lags
// (docs/operating.md): how many is logged, and no admission told yes over appendHoldBack before
// the crash may be among them. That everysec loses anything cannot be asserted: a crash right
// after an fsync loses nothing. WAITAOF there does not wait for the fsync, which is why New
// refuses WithDurableAck under everysec: the last case switches the server to everysec behind
// the engine's back to show it, and loses as everysec does.
func TestPowerLossSimulated(t *testing.T) {
	valkeytest.SkipIfShort(t, "kills the server (kill -9) to see what survives")
	so := buildPreload(t, "powerloss")
	durable := []engine.Option{engine.WithDurableAck(1, 0, 2*time.Second)}
	for _, tc := range []struct {
		name  string
		fsync string // the server's appendfsync once the engines are made
		opts  []engine.Option
		// losesRecent: admissions told yes within appendHoldBack of the crash may be lost, of
		// at least minOlder told before; else none may be, of at least minTold.
		losesRecent       bool
		minTold, minOlder int
	}{
		{"everysec loses only the last seconds", "everysec", nil, true, 2000, 1000},
		{"always loses nothing", "always", nil, false, 1000, 0},
		{"always + WithDurableAck(1, 0, 2s) loses nothing", "always", durable, false, 1000, 0},
		// Each call waits for its WAITAOF, answered on a cron tick: fewer admissions.
		{"WithDurableAck(1, 0, 2s), then everysec, loses only the last seconds", "everysec", durable, true, 200, 200},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// hz 100: under everysec the server answers WAITAOF on its cron tick, hz times a second.
			own := valkeytest.New(t, valkeytest.AppendOnly("always"), valkeytest.ServerArgs("--hz", "100"),
				valkeytest.ServerEnv("LD_PRELOAD="+so))
			c := own.Client(t)
			es := []*engine.Engine{enginetest.New(t, c, tc.opts...), enginetest.New(t, own.Client(t), tc.opts...)}
			set := c.B().ConfigSet().ParameterValue().ParameterValue("appendfsync", tc.fsync).Build()
			if err := c.Do(context.Background(), set).Error(); err != nil {
				t.Fatal(err)
			}
			keys := []string{enginetest.NewKey(t), enginetest.NewKey(t), enginetest.NewKey(t), enginetest.NewKey(t)}
			l := engine.Limit{Max: 1_000_000, Window: time.Hour}
			if tc.losesRecent {
				told, failed, killedAt := admitUntilCrash(t, own, es, keys, l, int64(tc.minTold), appendHoldBack+2*time.Second)
				wantOnlyRecentLost(t, "simulated power loss, "+tc.name, c, keys, told, failed, killedAt, tc.minOlder)
				return
			}
			told, failed, _ := admitUntilCrash(t, own, es, keys, l, int64(tc.minTold), 0)
			lost, logged := missingFromLogs(t, c, keys, told)
			t.Logf("simulated power loss, %s: %d told yes, %d calls failed with the crash, %d events in the logs after it, %d told-yes admissions lost",
				tc.name, len(told), failed, logged, len(lost))
			if len(lost) > 0 {
				t.Fatalf("%d of %d admissions told yes were lost to a simulated power loss, want none", len(lost), len(told))
			}
		})
	}
}
