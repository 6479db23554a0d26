// Command quickstart allows 5 login attempts per minute for a user and refuses the sixth.
package main

import (
	"cmp"
	"context"
	"fmt"
	"log"
	"os"
	"time"

	"github.com/strictrate/strictrate/engine"
	"github.com/valkey-io/valkey-go"
)

func main() {
	addr := cmp.Or(os.Getenv("VALKEY_ADDR"), "127.0.0.1:6379")
	client, err := valkey.NewClient(valkey.ClientOption{InitAddress: []string{addr}})
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()
	// New loads the scripts; keys go under the prefix "strictrate:" (engine.WithPrefix).
	limiter, err := engine.New(client)
	if err != nil {
		log.Fatal(err)
	}
	ctx := context.Background()
	_ = limiter.Reset(ctx, "login:alice") // so that every run starts afresh
	for attempt := 1; attempt <= 6; attempt++ {
		res, err := limiter.Allow(ctx, "login:alice", engine.PerMinute(5))
		switch {
		case err != nil: // the server could not decide: errors.Is(err, engine.ErrUnavailable)
			log.Fatal(err)
		case res.Allowed:
			fmt.Printf("attempt %d: allowed, %d left\n", attempt, res.Remaining)
		default:
			fmt.Printf("attempt %d: denied, retry in %s\n", attempt, res.RetryAfter.Round(time.Minute))
		}
	}
}
