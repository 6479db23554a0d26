package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"sync"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
)

// callTimeout is the deadline each request carries, as Envoy's rate limit filter sends one.
const callTimeout = time.Second

// throughput is what one server did with one number of descriptors a request, over all the
// rounds it was measured in.
type throughput struct {
	Server      string
	Descriptors int
	// Decisions is the number of requests (each one ShouldRateLimit decision, over all of
	// its descriptors) sent within the Measured time and finished, answered or failed;
	// PerSecond is the answered ones per second of it.
	Decisions int64
	PerSecond float64
	Measured  time.Duration
	// OK, OverLimit and Errors split Decisions (Errors: the call failed).
	OK, OverLimit, Errors int64
	// P50 and P99 are the latencies of the answered calls, seen by the caller.
	P50, P99 time.Duration
	// Used is what Valkey, the server's process and the callers used over the measured time.
	Used counters
}

// counters are the running totals drive reads at the start and the end of its measured time:
// CPU time used so far by Valkey (INFO cpu), by the server's process and by the bench's own
// (the callers), and the commands Valkey processed (INFO stats). A figure that cannot be read
// is negative.
type counters struct {
	ValkeyCPU, ServerCPU, ClientCPU time.Duration
	ValkeyCommands                  int64
}

// minus is c - d, field by field; a field unknown in either is unknown (-1).
func (c counters) minus(d counters) counters { return c.combine(d, -1) }

// plus is c + d, field by field; a field unknown in either is unknown (-1).
func (c counters) plus(d counters) counters { return c.combine(d, 1) }

// combine is c + sign*d, field by field; a field unknown in either is unknown (-1).
func (c counters) combine(d counters, sign int64) counters {
	f := func(a, b int64) int64 {
		if a < 0 || b < 0 {
			return -1
		}
		return a + sign*b
	}
	return counters{
		ValkeyCPU:      time.Duration(f(int64(c.ValkeyCPU), int64(d.ValkeyCPU))),
		ServerCPU:      time.Duration(f(int64(c.ServerCPU), int64(d.ServerCPU))),
		ClientCPU:      time.Duration(f(int64(c.ClientCPU), int64(d.ClientCPU))),
		ValkeyCommands: f(c.ValkeyCommands, d.ValkeyCommands),
	}
}

// perDecision is cpu divided by the decisions, in µs; negative when unknown.
func (t throughput) perDecision(cpu time.Duration) float64 {
	if cpu < 0 || t.Decisions == 0 {
		return -1
	}
	return float64(cpu) / float64(time.Microsecond) / float64(t.Decisions)
}

// commandsPerDecision is the Valkey commands a decision took; negative when unknown.
func (t throughput) commandsPerDecision() float64 {
	if t.Used.ValkeyCommands < 0 || t.Decisions == 0 {
		return -1
	}
	return float64(t.Used.ValkeyCommands) / float64(t.Decisions)
}

// sample is one measured run of drive.
type sample struct {
	ok, over, errs int64
	firstErr       error
	latencies      []time.Duration // of the answered calls
	measured       time.Duration
	used           counters
}

// summarize adds up a server's samples with n descriptors into its throughput.
func summarize(server string, n int, samples []sample) throughput {
	t := throughput{Server: server, Descriptors: n}
	var all []time.Duration
	for i, s := range samples {
		t.OK += s.ok
		t.OverLimit += s.over
		t.Errors += s.errs
		t.Measured += s.measured
		all = append(all, s.latencies...)
		if i == 0 {
			t.Used = s.used
		} else {
			t.Used = t.Used.plus(s.used)
		}
	}
	t.Decisions = t.OK + t.OverLimit + t.Errors
	if t.Measured > 0 {
		t.PerSecond = float64(t.OK+t.OverLimit) / t.Measured.Seconds()
	}
	if len(all) > 0 {
		slices.Sort(all)
		t.P50 = all[len(all)*50/100]
		t.P99 = all[min(len(all)-1, len(all)*99/100)]
	}
	return t
}

// loadShape is what drive sends.
type loadShape struct {
	descriptors int           // 1: user; 3: user, path and tenant
	callers     int           // concurrent callers, one request in flight each
	keys        int           // distinct user values
	warmup      time.Duration // unmeasured
	duration    time.Duration // measured
}

// descriptorValues are the values of each key of the three-descriptor request: many users,
// fewer paths, few tenants, as real traffic has.
func descriptorValues(keys int) (users, paths, tenants []string) {
	users = make([]string, keys)
	for i := range users {
		users[i] = "u" + strconv.Itoa(i)
	}
	paths = make([]string, max(1, keys/10))
	for i := range paths {
		paths[i] = "/api/" + strconv.Itoa(i)
	}
	tenants = make([]string, max(1, keys/100))
	for i := range tenants {
		tenants[i] = "t" + strconv.Itoa(i)
	}
	return users, paths, tenants
}

// drive runs shape's load against s: shape.callers callers, each sending its next request
// when the last is answered, for the warm-up and then the measured time. read is called when
// the measured time starts and when it ends. It fails when no request sent in the measured
// time was answered.
func drive(ctx context.Context, s *server, shape loadShape, read func(context.Context) counters) (sample, error) {
	users, paths, tenants := descriptorValues(shape.keys)
	start := time.Now()
	measureFrom := start.Add(shape.warmup)
	measureTo := measureFrom.Add(shape.duration)

	results := make([]sample, shape.callers)
	var wg sync.WaitGroup
	for c := range shape.callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := &results[c]
			r.latencies = make([]time.Duration, 0, 1<<12)
			rng := rand.New(rand.NewPCG(uint64(c), uint64(start.UnixNano())))
			client := s.clients[c%len(s.clients)]
			req := request(shape.descriptors)
			for {
				sent := time.Now()
				if sent.After(measureTo) || ctx.Err() != nil {
					return
				}
				req.Descriptors[0].Entries[0].Value = users[rng.IntN(len(users))]
				if shape.descriptors == 3 {
					req.Descriptors[1].Entries[0].Value = paths[rng.IntN(len(paths))]
					req.Descriptors[2].Entries[0].Value = tenants[rng.IntN(len(tenants))]
				}
				cctx, cancel := context.WithTimeout(ctx, callTimeout)
				resp, err := client.ShouldRateLimit(cctx, req)
				cancel()
				took := time.Since(sent)
				if sent.Before(measureFrom) {
					continue
				}
				switch {
				case err != nil:
					r.errs++
					if r.firstErr == nil {
						r.firstErr = err
					}
				case resp.GetOverallCode() == pb.RateLimitResponse_OK:
					r.ok++
					r.latencies = append(r.latencies, took)
				default:
					r.over++
					r.latencies = append(r.latencies, took)
				}
			}
		}()
	}
	sleepUntil(ctx, measureFrom)
	before := read(ctx)
	sleepUntil(ctx, measureTo)
	after := read(ctx)
	wg.Wait()
	if err := ctx.Err(); err != nil {
		return sample{}, err
	}

	out := sample{measured: shape.duration, used: after.minus(before)}
	for _, r := range results {
		out.ok += r.ok
		out.over += r.over
		out.errs += r.errs
		out.latencies = append(out.latencies, r.latencies...)
		if out.firstErr == nil {
			out.firstErr = r.firstErr
		}
	}
	if len(out.latencies) == 0 {
		return out, fmt.Errorf("bench: %s answered no request in %s: %v", s.name, shape.duration, out.firstErr)
	}
	return out, nil
}

// request makes a request of the bench's domain with n descriptors (1 or 3), whose values
// the caller sets before each call: the callers reuse one each, which the client has
// finished with when ShouldRateLimit returns.
func request(n int) *pb.RateLimitRequest {
	keys := []string{"user", "path", "tenant"}[:n]
	req := &pb.RateLimitRequest{Domain: benchDomain}
	for _, k := range keys {
		req.Descriptors = append(req.Descriptors, &rlv3.RateLimitDescriptor{
			Entries: []*rlv3.RateLimitDescriptor_Entry{{Key: k}},
		})
	}
	return req
}

// sleepUntil sleeps until t or until ctx ends.
func sleepUntil(ctx context.Context, t time.Time) {
	timer := time.NewTimer(time.Until(t))
	defer timer.Stop()
	select {
	case <-ctx.Done():
	case <-timer.C:
	}
}
