package engine_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/valkey-io/valkey-go"

	"github.com/strictrate/strictrate/engine"
	"github.com/strictrate/strictrate/inspect"
	"github.com/strictrate/strictrate/internal/enginetest"
	"github.com/strictrate/strictrate/internal/valkeytest"
)

// Resolution slots and calendar counters on a 3-primary cluster, batched per primary: keys
// over every slot, each asked more often than its Max by 64 goroutines over 4 clients. Per
// key, exactly Max is admitted (never more, no denial under Max), and the log holds what was
// admitted: the slot entries' events, or the period's counter.
func TestClusterQuotasExactPerKey(t *testing.T) {
	skipClusterIfShort(t)
	c := valkeytest.NewCluster(t, 3, 0)
	es := clusterEngines(t, c, 4)
	ctx := context.Background()
	// A calendar period that does not end during the test.
	calendar := engine.Calendar(5, engine.Month, time.UTC)
	if _, end := calendar.PeriodAt(time.Now()); time.Until(end) < 10*time.Minute {
		calendar = engine.Calendar(5, engine.Year, time.UTC)
	}
	slotted := engine.Limit{Max: 5, Window: time.Hour, Resolution: time.Minute}
	policies := []engine.Policy{
		{slotted},
		{calendar},
		{engine.Limit{Max: 50, Window: time.Second, Resolution: 100 * time.Millisecond}, calendar},
		{engine.PerMinute(100), calendar},
	}
	const numKeys, perKey, max = 400, 8, 5
	keys := make([]string, numKeys)
	for i := range keys {
		keys[i] = "quota-cluster:" + uuid.NewString()
	}
	var allowed, denied [numKeys]atomic.Int64
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for g := 0; g < 64; g++ {
		e := es[g%len(es)]
		wg.Go(func() {
			for n := next.Add(1) - 1; n < numKeys*perKey; n = next.Add(1) - 1 {
				i := int(n % numKeys)
				r, err := e.AllowPolicy(ctx, keys[i], policies[i%len(policies)], 1)
				switch {
				case err != nil:
					errs <- err
					return
				case r.Allowed:
					allowed[i].Add(1)
				default:
					denied[i].Add(1)
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	reader := c.Client(t, valkey.ClientOption{})
	for i, k := range keys {
		if a, d := allowed[i].Load(), denied[i].Load(); a != max || d != perKey-max {
			t.Fatalf("key %s (%v): %d admitted, %d denied; want %d, %d", k, policies[i%len(policies)], a, d, max, perKey-max)
		}
		log, err := inspect.Read(ctx, reader, enginetest.Prefix+k, 0)
		if err != nil {
			t.Fatal(err)
		}
		p := policies[i%len(policies)]
		hasCalendar, hasSliding := false, false
		for _, l := range p {
			hasCalendar = hasCalendar || l.IsCalendar()
			hasSliding = hasSliding || !l.IsCalendar()
		}
		if hasSliding && log.Events != max {
			t.Fatalf("key %s (%v): the log holds %d events, want %d", k, p, log.Events, max)
		}
		if hasCalendar && (len(log.Periods) != 1 || log.Periods[0].Events != max || log.Layout != 4) {
			t.Fatalf("key %s (%v): periods %+v layout %d, want one period of %d events, layout 4", k, p, log.Periods, log.Layout, max)
		}
		if p[0] == slotted && log.Count > 2 {
			t.Fatalf("key %s (%v): %d entries for a minute's slots within seconds, want at most 2", k, p, log.Count)
		}
	}
}
