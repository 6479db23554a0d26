package main

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/valkey-io/valkey-go"

	"github.com/strictrate/strictrate/engine"
	"github.com/strictrate/strictrate/internal/valkeytest"
)

// BenchmarkReplicaAck measures what WithReplicaAck costs: Allow on a real cluster of one
// primary and one replica, without and with WAIT 1 after each decision.
func BenchmarkReplicaAck(b *testing.B) {
	c := valkeytest.NewCluster(b, 1, 1)
	var clients []valkey.Client
	for i := 0; i < benchClients; i++ {
		clients = append(clients, c.Client(b, valkey.ClientOption{}))
	}
	prefix := "strictrate-gobench:" + uuid.NewString()[:8] + ":"
	for _, tc := range []struct {
		name string
		opts []engine.Option
	}{
		{"none", nil},
		{"ack1", []engine.Option{engine.WithReplicaAck(1, time.Second)}},
	} {
		var es []*engine.Engine
		for _, client := range clients {
			e, err := engine.New(client, append([]engine.Option{engine.WithPrefix(prefix)}, tc.opts...)...)
			if err != nil {
				b.Fatal(err)
			}
			es = append(es, e)
		}
		b.Run(tc.name, func(b *testing.B) {
			limit := engine.Limit{Max: 100, Window: time.Second}
			runOnRandomKeys(b, manyKeys("ack:"+tc.name), func(ctx context.Context, g int, key string) error {
				_, err := es[g%len(es)].Allow(ctx, key, limit)
				return err
			})
		})
	}
}
