package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/strictrate/strictrate/engine"
	"github.com/strictrate/strictrate/internal/valkeytest"
)

// DurabilityRow is scenario 6 for one persistence setting: the throughput scenario's batched
// decisions (the default engine) against a server of its own, started with that setting.
type DurabilityRow struct {
	Setting string `json:"setting"`
	ThroughputRow
	// OverNone is decisions/s over the no-persistence row's, same run.
	OverNone float64 `json:"decisions_per_sec_over_no_persistence"`
}

// durabilitySetting is how one row's server is started, and the engine's options beyond batching.
type durabilitySetting struct {
	name   string
	server []valkeytest.Option
	opts   []engine.Option
}

var durabilitySettings = []durabilitySetting{
	{"no persistence", []valkeytest.Option{valkeytest.OwnServer()}, nil},
	{"appendfsync everysec", []valkeytest.Option{valkeytest.AppendOnly("everysec")}, nil},
	{"appendfsync always", []valkeytest.Option{valkeytest.AppendOnly("always")}, nil},
	// Under everysec New only warns, but WAITAOF there may answer before the fsync: always is the
	// setting WithDurableAck is for.
	{"always + WithDurableAck(1, 0, 1s)", []valkeytest.Option{valkeytest.AppendOnly("always")},
		[]engine.Option{engine.WithDurableAck(1, 0, time.Second)}},
}

// durability measures every setting in turn, each on a throwaway server of its own (whatever
// -addr says: the settings are the servers'), which it stops before the next. Where no server
// can be started it returns a note instead.
func (b *bencher) durability(ctx context.Context) ([]DurabilityRow, string, error) {
	var rows []DurabilityRow
	for _, s := range durabilitySettings {
		row, err := b.durabilityRow(ctx, s)
		if errors.Is(err, valkeytest.ErrNoServer) {
			note := "durability: skipped, no server of its own could be started: " + err.Error()
			b.logf("%s", note)
			return nil, note, nil
		}
		if err != nil {
			return nil, "", fmt.Errorf("%s: %w", s.name, err)
		}
		if len(rows) > 0 && rows[0].DecisionsPerSec > 0 {
			row.OverNone = row.DecisionsPerSec / rows[0].DecisionsPerSec
		} else {
			row.OverNone = 1
		}
		rows = append(rows, row)
	}
	return rows, "", nil
}

func (b *bencher) durabilityRow(ctx context.Context, s durabilitySetting) (DurabilityRow, error) {
	srv, err := valkeytest.Start(ctx, s.server...)
	if err != nil {
		return DurabilityRow{}, err
	}
	defer srv.Close()
	sub, err := newBencher(ctx, b.cfg, srv, b.progress)
	if err != nil {
		return DurabilityRow{}, err
	}
	defer sub.close()
	sub.start = b.start
	opts := append(append([]engine.Option{}, batched...), s.opts...)
	row, err := sub.throughput(ctx, throughputVariant{name: "durability " + s.name, opts: opts, clock: "server"})
	return DurabilityRow{Setting: s.name, ThroughputRow: row}, err
}
