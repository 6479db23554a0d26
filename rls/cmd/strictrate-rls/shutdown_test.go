package main

import (
	"context"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/strictrate/strictrate/internal/valkeytest"
)

// TestSIGTERM: on SIGTERM, /healthcheck fails at once, a request in flight is still answered
// (the process drains), and the process exits 0 within the drain timeout.
func TestSIGTERM(t *testing.T) {
	valkeytest.SkipIfShort(t, "runs the strictrate-rls command as a process")
	t.Parallel()
	// A Valkey of the test's own, which it pauses to hold a request in flight.
	valkey := valkeytest.New(t, valkeytest.OwnServer())
	root := t.TempDir()
	writeFile(t, filepath.Join(root, "ratelimit", "config", "edge.yaml"), edgeConfig(5))
	e := fileEnv(t, root)
	e["REDIS_URL"] = valkey.Addr
	e["LOG_LEVEL"] = "info"
	p := start(t, e)
	c := dial(t, p.grpc)
	req := request("edge", "remote_address", "10.0.0.1")
	if got := decide(t, c, req); got != pb.RateLimitResponse_OK {
		t.Fatalf("a first request: %v, want OK", got)
	}
	if code := p.health(); code != http.StatusOK {
		t.Fatalf("/healthcheck before SIGTERM: %d, want 200", code)
	}

	// Valkey holds every command for a while: the next request stays in flight across SIGTERM.
	const pause = 1500 * time.Millisecond
	admin := valkey.Client(t)
	if err := admin.Do(context.Background(), admin.B().ClientPause().Timeout(pause.Milliseconds()).All().Build()).Error(); err != nil {
		t.Fatalf("CLIENT PAUSE: %v", err)
	}
	type answer struct {
		resp *pb.RateLimitResponse
		err  error
	}
	inFlight := make(chan answer, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		resp, err := c.ShouldRateLimit(ctx, req)
		inFlight <- answer{resp, err}
	}()
	// The request reaches the server on the open connection in well under this.
	time.Sleep(300 * time.Millisecond)

	sent := time.Now()
	p.terminate()
	// Once the process says it is shutting down, /healthcheck fails, and at once: it does not
	// wait for the paused Valkey (nothing may answer at all: the listener is closing).
	p.waitLog("shutting down")
	probed := time.Now()
	if code := p.health(); code == http.StatusOK {
		t.Errorf("/healthcheck after SIGTERM: 200, want a failure")
	}
	if took := time.Since(probed); took > pause/2 {
		t.Errorf("/healthcheck after SIGTERM took %v to fail, want at once", took)
	}
	a := <-inFlight
	if a.err != nil || a.resp.GetOverallCode() != pb.RateLimitResponse_OK {
		t.Errorf("the request in flight at SIGTERM: %v, %v; want OK once Valkey answers", a.resp, a.err)
	}
	if code := p.wait(drainTimeout + time.Second); code != 0 {
		t.Errorf("exit code after SIGTERM: %d, want 0", code)
	}
	if took := time.Since(sent); took > drainTimeout {
		t.Errorf("the process took %v to exit after SIGTERM, longer than the drain timeout %v", took, drainTimeout)
	}
}

// TestReferenceSettings: a reference setting that is not supported is named in a warning at
// start; one whose absence would change what is limited stops the command, named.
func TestReferenceSettings(t *testing.T) {
	valkeytest.SkipIfShort(t, "runs the strictrate-rls command as a process")
	t.Parallel()
	root := t.TempDir()
	writeFile(t, filepath.Join(root, "ratelimit", "config", "edge.yaml"), edgeConfig(5))

	e := fileEnv(t, root)
	e["REDIS_PIPELINE_LIMIT"] = "8"
	p := start(t, e)
	var warning string
	for line := range strings.Lines(p.log.String()) {
		if strings.Contains(line, "REDIS_PIPELINE_LIMIT") {
			warning = line
		}
	}
	if !strings.Contains(warning, "level=WARN") {
		t.Errorf("no warning names REDIS_PIPELINE_LIMIT=8; the output:\n%s", p.log)
	}
	p.stop()

	for _, v := range [][2]string{{"REDIS_PERSECOND", "true"}, {"PORT", "http"}} {
		e := fileEnv(t, root)
		e[v[0]] = v[1]
		p := launch(t, e)
		if code := p.wait(10 * time.Second); code == 0 {
			t.Errorf("%s=%s: the command exited 0", v[0], v[1])
		}
		if out := p.log.String(); !strings.Contains(out, v[0]+"=") {
			t.Errorf("%s=%s: the output does not name it:\n%s", v[0], v[1], out)
		}
	}
}
