package engine_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"

	"github.com/strictrate/strictrate/engine"
	"github.com/strictrate/strictrate/internal/valkeytest"
)

// New refuses a server that may evict any key, unless told to only warn or not to check.
func TestNewRefusesAServerThatMayEvictKeys(t *testing.T) {
	own := valkeytest.New(t, valkeytest.OwnServer())
	c := own.Client(t)
	ctx := context.Background()
	setPolicy := func(p string) {
		t.Helper()
		if err := c.Do(ctx, c.B().ConfigSet().ParameterValue().ParameterValue("maxmemory-policy", p).Build()).Error(); err != nil {
			t.Fatal(err)
		}
	}

	setPolicy("allkeys-lru")
	if _, err := engine.New(c); !errors.Is(err, engine.ErrEvictionPolicy) || !strings.Contains(err.Error(), "allkeys-lru") {
		t.Fatalf("New with allkeys-lru: %v, want ErrEvictionPolicy naming the policy", err)
	}
	var logs bytes.Buffer
	logger := slog.New(slog.NewTextHandler(&logs, nil))
	if _, err := engine.New(c, engine.WithEvictionCheck(engine.Warn), engine.WithLogger(logger)); err != nil {
		t.Fatalf("New with Warn: %v", err)
	}
	if !strings.Contains(logs.String(), "level=WARN") || !strings.Contains(logs.String(), "allkeys-lru") {
		t.Fatalf("Warn logged %q, want a WARN naming allkeys-lru", logs.String())
	}
	logs.Reset()
	if _, err := engine.New(c, engine.WithEvictionCheck(engine.Ignore), engine.WithPersistenceCheck(engine.Ignore),
		engine.WithLogger(logger)); err != nil || logs.Len() != 0 {
		t.Fatalf("New with Ignore: %v, logged %q; want neither", err, logs.String())
	}

	setPolicy("volatile-lru")
	if _, err := engine.New(c); err != nil {
		t.Fatalf("New with volatile-lru: %v", err)
	}

	// A user that may not run CONFIG (as on many managed services) is not checked.
	setPolicy("allkeys-lru")
	limited := own.NewUser(t, "noconfig", "pw", "+@all", "-config")
	if _, err := engine.New(limited); err != nil {
		t.Fatalf("New without CONFIG permission: %v", err)
	}
}
