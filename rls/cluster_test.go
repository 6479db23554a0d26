package rls_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	"github.com/valkey-io/valkey-go"

	"github.com/strictrate/strictrate/internal/enginetest"
	"github.com/strictrate/strictrate/internal/valkeytest"
)

const clusterConfig = `
domain: spread
descriptors:
  - key: a
    rate_limit: {unit: minute, requests_per_unit: 20}
  - key: b
    rate_limit: {unit: minute, requests_per_unit: 30}
  - key: c
    rate_limit: {unit: minute, requests_per_unit: 40}
`

// On a 3-primary cluster, requests carry descriptors whose counters lie on three different
// primaries, so that each request is decided primary by primary, with refunds when a later
// primary denies. 64 concurrent callers, each request with its own hits per descriptor and
// some without one of the descriptors: no counter ever admits more than its rule, every
// counter holds exactly the hits of the requests answered OK (a denied request consumed
// nothing, not even for a while once the run is over), and what is left can still be taken to
// the last hit.
func TestClusterNeverOverAdmits(t *testing.T) {
	valkeytest.SkipIfShort(t, "starts a cluster")
	cluster := valkeytest.NewCluster(t, 3, 0)
	client := cluster.Client(t, valkey.ClientOption{})
	r := start(t, enginetest.New(t, client), clusterConfig)

	// A value per rule whose counter lies on a primary of its own.
	names := []string{"a", "b", "c"}
	limits := map[string]int{"a": 20, "b": 30, "c": 40}
	values := map[string]string{}
	for i, name := range names {
		for n := 0; ; n++ {
			v := fmt.Sprint("v", n)
			if cluster.Primaries[i].Owns(enginetest.Prefix + r.key("spread", name, v)) {
				values[name] = v
				break
			}
		}
	}
	descs := map[string]*rlv3.RateLimitDescriptor{}
	for _, name := range names {
		descs[name] = descriptor(name, values[name])
	}
	// The shapes of requests: all three, or two of them, in an order of their own.
	shapes := [][]string{{"a", "b", "c"}, {"c", "b", "a"}, {"a", "b", "c"}, {"b", "c"}, {"c", "a"}}

	var (
		mu       sync.Mutex
		admitted = map[string][]admission{}
		wg       sync.WaitGroup
		begin    = make(chan struct{})
	)
	for g := range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(g), 20))
			<-begin
			for range 8 {
				shape := shapes[rng.IntN(len(shapes))]
				hits := map[string]int{}
				var ds []*rlv3.RateLimitDescriptor
				for _, name := range shape {
					hits[name] = 1 + rng.IntN(3)
					ds = append(ds, withHits(descs[name], uint64(hits[name])))
				}
				resp, err := askCtx(context.Background(), r.client, "spread", ds...)
				if err != nil {
					t.Error(err)
					return
				}
				if resp.OverallCode != ok {
					denied := false
					for _, st := range resp.Statuses {
						denied = denied || st.Code == over
					}
					if !denied {
						t.Errorf("a request denied without a descriptor over its limit: %v", resp)
					}
					continue
				}
				now := time.Now()
				mu.Lock()
				for _, name := range shape {
					admitted[name] = append(admitted[name], admission{now, hits[name]})
				}
				mu.Unlock()
			}
		}()
	}
	close(begin)
	wg.Wait()
	if t.Failed() {
		return
	}

	for _, name := range names {
		total := 0
		for _, a := range admitted[name] {
			total += a.hits
		}
		auditWindow(t, "rule "+name, admitted[name], time.Minute, limits[name])
		stored := enginetest.StoredEvents(t, client, r.key("spread", name, values[name]))
		if stored != int64(total) {
			t.Fatalf("rule %s: the counter holds %d events, the requests answered OK carried %d hits", name, stored, total)
		}
		// A check sees the room the admitted hits left, then the room is taken hit by hit.
		check := ask(t, r.client, "spread", 0, withHits(descs[name], 0))
		if got, want := int(check.Statuses[0].LimitRemaining), limits[name]-total; got != want {
			t.Fatalf("rule %s: a check reports %d remaining, want %d (%d admitted of %d)", name, got, want, total, limits[name])
		}
		for i := total; i < limits[name]; i++ {
			wantCode(t, fmt.Sprintf("rule %s, hit %d after the run", name, i+1), ask(t, r.client, "spread", 0, descs[name]), ok, ok)
		}
		wantCode(t, fmt.Sprintf("rule %s, full", name), ask(t, r.client, "spread", 0, descs[name]), over, over)
		t.Logf("rule %s: %d of %d admitted under concurrency", name, total, limits[name])
	}
}
