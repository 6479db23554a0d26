package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/strictrate/strictrate/internal/valkeytest"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// edgeConfig is a file of the domain edge that limits each remote address to perMinute.
func edgeConfig(perMinute int) string {
	return fmt.Sprintf(`domain: edge
descriptors:
  - key: remote_address
    rate_limit:
      unit: minute
      requests_per_unit: %d
`, perMinute)
}

// badUnitConfig is a file the reference refuses: its unit does not exist.
const badUnitConfig = `domain: edge
descriptors:
  - key: remote_address
    rate_limit:
      unit: fortnight
      requests_per_unit: 1
`

// fileEnv is baseEnv reading the files of root/ratelimit/config, each change of which is
// watched (RUNTIME_WATCH_ROOT=false, as Envoy Gateway sets it), with Prometheus on.
func fileEnv(t *testing.T, root string) env {
	e := baseEnv(t)
	e["RUNTIME_ROOT"] = root
	e["RUNTIME_SUBDIRECTORY"] = "ratelimit"
	e["RUNTIME_WATCH_ROOT"] = "false"
	e["USE_PROMETHEUS"] = "true"
	return e
}

// TestFileConfig serves the reference's files: a request is decided by them, an edit applies
// while serving, and a bad edit is refused (logged, counted) while the last good configuration
// stays in force.
func TestFileConfig(t *testing.T) {
	valkeytest.SkipIfShort(t, "runs the strictrate-rls command as a process")
	t.Parallel()
	root := t.TempDir()
	file := filepath.Join(root, "ratelimit", "config", "edge.yaml")
	writeFile(t, file, edgeConfig(3))
	p := start(t, fileEnv(t, root))
	if code := p.health(); code != http.StatusOK {
		t.Fatalf("/healthcheck: %d, want 200", code)
	}
	c := dial(t, p.grpc)

	first := request("edge", "remote_address", "10.0.0.1")
	if got := decisions(t, c, first, 4); got != want(3, 1) {
		t.Fatalf("4 requests against 3 a minute: %s, want %s", got, want(3, 1))
	}
	// /json decides the same request, and answers 429 when it is over the limit.
	code, body, err := post("http://"+p.http+"/json", `{"domain":"edge","descriptors":[{"entries":[{"key":"remote_address","value":"10.0.0.1"}]}]}`)
	if err != nil || code != http.StatusTooManyRequests || !strings.Contains(body, `"overallCode":"OVER_LIMIT"`) {
		t.Errorf("/json over the limit: %d %q %v, want 429 and OVER_LIMIT", code, body, err)
	}
	labels := []string{`domain="edge"`, `key1="remote_address"`}
	if got := p.metric("/metrics", "ratelimit_service_rate_limit_total_hits", labels...); got != 5 {
		t.Errorf("total_hits of edge.remote_address: %v, want 5", got)
	}
	if got := p.metric("/metrics", "ratelimit_service_rate_limit_over_limit", labels...); got != 2 {
		t.Errorf("over_limit of edge.remote_address: %v, want 2", got)
	}

	// An edit applies while serving: the address's 3 admissions leave 2 of the new 5.
	writeFile(t, file, edgeConfig(5))
	p.waitConfig("requests_per_unit=5")
	if got := decisions(t, c, first, 3); got != want(2, 1) {
		t.Errorf("3 more requests after raising the limit to 5: %s, want %s", got, want(2, 1))
	}

	// A bad edit is refused: counted, logged with the file's name, and the 5 stay in force.
	errorsBefore := p.metric("/metrics", "ratelimit_service_config_load_error")
	writeFile(t, file, badUnitConfig)
	p.waitFor("config_load_error to count the bad file", func() bool {
		return p.metric("/metrics", "ratelimit_service_config_load_error") > errorsBefore
	})
	p.waitLog("fortnight")
	if !strings.Contains(p.log.String(), "edge.yaml") {
		t.Errorf("the refusal does not name the file edge.yaml")
	}
	if cfg := p.rlconfig(); !strings.Contains(cfg, "requests_per_unit=5") {
		t.Errorf("/rlconfig after a bad edit: %q, want the last good configuration", cfg)
	}
	if got := decisions(t, c, request("edge", "remote_address", "10.0.0.2"), 6); got != want(5, 1) {
		t.Errorf("6 requests of a new address after a bad edit: %s, want %s", got, want(5, 1))
	}
}

// TestBadConfigAtStart: a configuration refused at start stops the command with a message that
// names the file, unless FORCE_START_WITHOUT_INITIAL_CONFIG, with which it serves (answering
// errors until a configuration loads) and loads the file once it is fixed.
func TestBadConfigAtStart(t *testing.T) {
	valkeytest.SkipIfShort(t, "runs the strictrate-rls command as a process")
	t.Parallel()
	root := t.TempDir()
	file := filepath.Join(root, "ratelimit", "config", "bad.yaml")
	writeFile(t, file, badUnitConfig)

	refusedAtStart(t, fileEnv(t, root), "bad.yaml", "fortnight")

	e := fileEnv(t, root)
	e["FORCE_START_WITHOUT_INITIAL_CONFIG"] = "true"
	p := start(t, e)
	c := dial(t, p.grpc)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if resp, err := c.ShouldRateLimit(ctx, request("edge", "remote_address", "10.0.0.1")); status.Code(err) == codes.OK {
		t.Errorf("ShouldRateLimit without a configuration: %v, want an error", resp)
	}
	if got := p.metric("/metrics", "ratelimit_service_config_load_error"); got < 1 {
		t.Errorf("config_load_error after a bad file at start: %v, want at least 1", got)
	}
	writeFile(t, file, edgeConfig(1))
	p.waitConfig("requests_per_unit=1")
	if got := decisions(t, c, request("edge", "remote_address", "10.0.0.1"), 2); got != want(1, 1) {
		t.Errorf("2 requests against 1 a minute once the file is fixed: %s, want %s", got, want(1, 1))
	}
}

// refusedAtStart runs the command with e, whose configuration it must refuse: it exits
// non-zero, and its output holds every one of wants.
func refusedAtStart(t *testing.T, e env, wants ...string) {
	t.Helper()
	p := launch(t, e)
	if code := p.wait(10 * time.Second); code == 0 {
		t.Errorf("the command exited 0 with a configuration it must refuse")
	}
	out := p.log.String()
	for _, want := range wants {
		if !strings.Contains(out, want) {
			t.Errorf("the command's output does not say %q:\n%s", want, out)
		}
	}
}

// TestHugeRuleAtStart: a rule above the engine's largest limit (2,147,483,647) is refused at
// start, with a message that names the file, the rule and the value, and says how to write
// no limit; the reference would accept it, and capping it in silence would deny what it
// admits.
func TestHugeRuleAtStart(t *testing.T) {
	valkeytest.SkipIfShort(t, "runs the strictrate-rls command as a process")
	t.Parallel()
	root := t.TempDir()
	writeFile(t, filepath.Join(root, "ratelimit", "config", "huge.yaml"), edgeConfig(4294967295))
	refusedAtStart(t, fileEnv(t, root), "huge.yaml", "line 6", "edge.remote_address", "4294967295", "unlimited: true")
}

// TestWatchRoot: with RUNTIME_WATCH_ROOT=true (the reference's default), a deployment that
// swaps the link RUNTIME_ROOT to a new tree is reloaded.
func TestWatchRoot(t *testing.T) {
	valkeytest.SkipIfShort(t, "runs the strictrate-rls command as a process")
	t.Parallel()
	dir := t.TempDir()
	for version, limit := range map[string]int{"v1": 1, "v2": 2} {
		writeFile(t, filepath.Join(dir, version, "ratelimit", "config", "edge.yaml"), edgeConfig(limit))
	}
	root := filepath.Join(dir, "current")
	if err := os.Symlink(filepath.Join(dir, "v1"), root); err != nil {
		t.Fatal(err)
	}
	e := fileEnv(t, root)
	e["RUNTIME_WATCH_ROOT"] = "true"
	p := start(t, e)
	p.waitConfig("requests_per_unit=1")

	next := filepath.Join(dir, "next")
	if err := os.Symlink(filepath.Join(dir, "v2"), next); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(next, root); err != nil {
		t.Fatal(err)
	}
	p.waitConfig("requests_per_unit=2")
	c := dial(t, p.grpc)
	if got := decisions(t, c, request("edge", "remote_address", "10.0.0.1"), 3); got != want(2, 1) {
		t.Errorf("3 requests against the new tree's 2 a minute: %s, want %s", got, want(2, 1))
	}
}

// post sends body to url as JSON and returns the status and the body of the answer.
func post(url, body string) (int, string, error) {
	resp, err := http.Post(url, "application/json", strings.NewReader(body))
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), err
}

// TestMergeDomainConfig: two files of one domain are refused at start, as the reference refuses
// them, unless MERGE_DOMAIN_CONFIG=true, with which the rules of both apply.
func TestMergeDomainConfig(t *testing.T) {
	valkeytest.SkipIfShort(t, "runs the strictrate-rls command as a process")
	t.Parallel()
	root := t.TempDir()
	dir := filepath.Join(root, "ratelimit", "config")
	writeFile(t, filepath.Join(dir, "addresses.yaml"), edgeConfig(2))
	writeFile(t, filepath.Join(dir, "paths.yaml"), `domain: edge
descriptors:
  - key: path
    rate_limit: {unit: minute, requests_per_unit: 1}
`)
	refusedAtStart(t, fileEnv(t, root), "duplicate domain")

	e := fileEnv(t, root)
	e["MERGE_DOMAIN_CONFIG"] = "true"
	p := start(t, e)
	c := dial(t, p.grpc)
	if got := decisions(t, c, request("edge", "remote_address", "10.0.0.1"), 3); got != want(2, 1) {
		t.Errorf("3 requests against the first file's 2 a minute: %s, want %s", got, want(2, 1))
	}
	if got := decisions(t, c, request("edge", "path", "/"), 2); got != want(1, 1) {
		t.Errorf("2 requests against the second file's 1 a minute: %s, want %s", got, want(1, 1))
	}
}

// TestDisableStats: DISABLE_STATS serves no metrics, on the debug port or the Prometheus
// one, while decisions go on as before.
func TestDisableStats(t *testing.T) {
	valkeytest.SkipIfShort(t, "runs the strictrate-rls command as a process")
	t.Parallel()
	root := t.TempDir()
	writeFile(t, filepath.Join(root, "ratelimit", "config", "edge.yaml"), edgeConfig(3))
	e := fileEnv(t, root) // USE_PROMETHEUS=true
	e["DISABLE_STATS"] = "true"
	p := start(t, e)
	c := dial(t, p.grpc)
	if got := decisions(t, c, request("edge", "remote_address", "10.0.0.1"), 4); got != want(3, 1) {
		t.Fatalf("4 requests against 3 a minute: %s, want %s", got, want(3, 1))
	}
	if code, _, err := get("http://" + p.debug + "/metrics"); err != nil || code != http.StatusNotFound {
		t.Errorf("/metrics on the debug port: %d %v, want 404", code, err)
	}
	if _, _, err := get("http://" + p.prometheus + "/metrics"); err == nil {
		t.Errorf("the Prometheus endpoint answers under DISABLE_STATS")
	}
}
