package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/strictrate/strictrate/internal/valkeytest"
)

// The program runs end to end, briefly: every row is measured, printed and written, with
// positive figures.
func TestRunMeasuresEveryRow(t *testing.T) {
	valkeytest.SkipIfShort(t, "runs the whole peers program")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	path := filepath.Join(t.TempDir(), "peers.json")
	var out bytes.Buffer
	cfg := config{Duration: 300 * time.Millisecond, Goroutines: 8, Keys: 50, JSONPath: path}
	if err := run(ctx, cfg, &out, io.Discard); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var r Report
	if err := json.Unmarshal(data, &r); err != nil {
		t.Fatalf("the -json file does not decode: %v", err)
	}
	if r.Settings.Config.Goroutines != 8 || r.Settings.Config.Keys != 50 || r.Settings.LimitMax != benchRate.max {
		t.Errorf("settings = %+v, want the run's", r.Settings)
	}
	if len(r.Rows) != len(contenders) {
		t.Fatalf("%d rows, want one per contender (%d)", len(r.Rows), len(contenders))
	}
	for i, row := range r.Rows {
		if row.Limiter != contenders[i].name {
			t.Errorf("row %d is %q, want %q", i, row.Limiter, contenders[i].name)
		}
		if row.Decisions <= 0 || row.Admitted <= 0 || row.DecisionsPerSec <= 0 || row.ServerCPUPerOp <= 0 ||
			row.ServerCmdPerOp <= 0 ||
			row.ClientCPUPerOp <= 0 || row.BatchedOverThis <= 0 {
			t.Errorf("%s: a figure is not positive: %+v", row.Limiter, row)
		}
		if row.Admitted > row.Decisions {
			t.Errorf("%s: admitted %d of %d decisions", row.Limiter, row.Admitted, row.Decisions)
		}
		if !strings.Contains(out.String(), "| "+row.Limiter+" |") {
			t.Errorf("the table has no row for %s:\n%s", row.Limiter, out.String())
		}
	}
	if r.Rows[0].BatchedOverThis != 1 {
		t.Errorf("strictrate batched over itself = %v, want 1", r.Rows[0].BatchedOverThis)
	}
}

// Every adapter is wired to its limiter as the comparison assumes: with 5 per minute, ten
// calls in a row for one key admit the first five and deny the rest, whichever of the
// contender's clients takes each call.
func TestEveryAdapterAdmitsExactlyTheLimit(t *testing.T) {
	srv := valkeytest.New(t, valkeytest.OwnServer())
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, c := range contenders {
		t.Run(c.name, func(t *testing.T) {
			ls, closeLimiters, err := c.connect(ctx, srv.Addr, rate{max: 5, window: time.Minute}, 2)
			if err != nil {
				t.Fatal(err)
			}
			defer closeLimiters()
			key := "exact:" + c.name // a key of its own: the contenders share the server
			var got []bool
			for i := 0; i < 10; i++ {
				ok, err := ls[i%len(ls)].allow(ctx, key)
				if err != nil {
					t.Fatalf("call %d: %v", i+1, err)
				}
				got = append(got, ok)
			}
			want := []bool{true, true, true, true, true, false, false, false, false, false}
			for i := range want {
				if got[i] != want[i] {
					t.Fatalf("admitted %v, want %v", got, want)
				}
			}
		})
	}
}

func TestValidateRefusesNonsense(t *testing.T) {
	for _, c := range []config{
		{Duration: 0, Goroutines: 1, Keys: 1},
		{Duration: time.Second, Goroutines: 0, Keys: 1},
		{Duration: time.Second, Goroutines: 1, Keys: 0},
	} {
		if err := c.validate(); err == nil {
			t.Errorf("validate(%+v) = nil, want an error", c)
		}
	}
	if err := (config{Duration: time.Second, Goroutines: 1, Keys: 1}).validate(); err != nil {
		t.Errorf("validate of a sound config: %v", err)
	}
}
