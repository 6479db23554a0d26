package main

import (
	"context"
	"errors"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/valkey-io/valkey-go"

	"github.com/strictrate/strictrate/engine"
	"github.com/strictrate/strictrate/internal/enginetest"
	"github.com/strictrate/strictrate/internal/valkeytest"
	"github.com/strictrate/strictrate/rls/settings"
)

// busyAdmissions is how many requests make a descriptor's key busy: more entries than the 32
// a log's header holds, the size from which layout 5 writes a header of its own (inspect
// reports a smaller log of layout 5 as 3).
const busyAdmissions = 40

// TestWriteLayout: STRICTRATE_WRITE_LAYOUT reaches the engine. A descriptor admitted
// busyAdmissions times is stored in layout 5 under STRICTRATE_WRITE_LAYOUT=5, and without the
// variable in the layout an engine given no WithWriteLayout writes (the engine's default); a
// layout the engine does not write stops the start, naming the variable.
func TestWriteLayout(t *testing.T) {
	valkeytest.SkipIfShort(t, "runs the strictrate-rls command as a process")
	t.Parallel()
	root := t.TempDir()
	writeFile(t, filepath.Join(root, "ratelimit", "config", "edge.yaml"), edgeConfig(1000))
	c := server.Client(t)

	prefix := baseEnv(t)["CACHE_KEY_PREFIX"]
	byDefault := enginetest.New(t, c, engine.WithPrefix(prefix))
	for range busyAdmissions {
		if _, err := byDefault.Allow(context.Background(), "busy", engine.Limit{Max: 1000, Window: time.Minute}); err != nil {
			t.Fatalf("Allow: %v", err)
		}
	}
	engineDefault := enginetest.Log(t, c, prefix, "busy").Layout

	for _, tc := range []struct {
		value string // STRICTRATE_WRITE_LAYOUT; "" leaves it unset
		want  int
	}{{"", engineDefault}, {"2", 2}, {"5", 5}} {
		e := fileEnv(t, root)
		if tc.value != "" {
			e["STRICTRATE_WRITE_LAYOUT"] = tc.value
		}
		p := start(t, e)
		if got := decisions(t, dial(t, p.grpc), request("edge", "remote_address", "10.0.0.1"), busyAdmissions); got != want(busyAdmissions, 0) {
			t.Fatalf("STRICTRATE_WRITE_LAYOUT=%q: %s, want %s", tc.value, got, want(busyAdmissions, 0))
		}
		log := enginetest.Log(t, c, "", storedKey(t, c, e["CACHE_KEY_PREFIX"]))
		if log.Layout != tc.want || log.Events != busyAdmissions {
			t.Errorf("STRICTRATE_WRITE_LAYOUT=%q: the descriptor's log holds %d events in layout %d, want %d in layout %d",
				tc.value, log.Events, log.Layout, busyAdmissions, tc.want)
		}
	}

	e := fileEnv(t, root)
	e["STRICTRATE_WRITE_LAYOUT"] = "4"
	refusedAtStart(t, e, "STRICTRATE_WRITE_LAYOUT=4", "2, 3 or 5")
}

// TestWriteLayoutsAreTheEngines: the settings accept exactly the layouts engine.New takes,
// so that a value the engine would refuse is refused with the other settings, before Valkey
// is dialled, and none the engine writes is refused.
func TestWriteLayoutsAreTheEngines(t *testing.T) {
	valkeytest.SkipIfShort(t, "starts engines on Valkey")
	t.Parallel()
	c := server.Client(t)
	for v := range 10 {
		value := strconv.Itoa(v)
		_, _, serr := settings.FromEnv(func(name string) (string, bool) {
			return value, name == "STRICTRATE_WRITE_LAYOUT"
		})
		_, eerr := engine.New(c, engine.WithWriteLayout(v), engine.WithPersistenceCheck(engine.Ignore))
		if eerr != nil && !errors.Is(eerr, engine.ErrInvalidArgument) {
			t.Fatalf("engine.New with WithWriteLayout(%d): %v", v, eerr)
		}
		if (serr == nil) != (eerr == nil) {
			t.Errorf("STRICTRATE_WRITE_LAYOUT=%d: the settings say %v, engine.New %v", v, serr, eerr)
		}
	}
}

// storedKey is the one key in Valkey under the engine's default prefix and the service's
// CACHE_KEY_PREFIX prefix, found by SCAN so that the test does not spell the service's key
// format.
func storedKey(t *testing.T, c valkey.Client, prefix string) string {
	t.Helper()
	pattern := "strictrate:" + prefix + "*"
	var found []string
	var cursor uint64
	for {
		entry, err := c.Do(context.Background(), c.B().Scan().Cursor(cursor).Match(pattern).Count(1000).Build()).AsScanEntry()
		if err != nil {
			t.Fatalf("SCAN %s: %v", pattern, err)
		}
		found = append(found, entry.Elements...)
		if cursor = entry.Cursor; cursor == 0 {
			break
		}
	}
	if len(found) != 1 {
		t.Fatalf("SCAN %s: %q, want one key", pattern, found)
	}
	return found[0]
}
