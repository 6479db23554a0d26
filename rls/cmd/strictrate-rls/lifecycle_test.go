package main

import (
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/strictrate/strictrate/internal/valkeytest"
)

// logRecord is one line of the text log (slog's key=value format, a value quoted when it
// must be), by key; nil when the line does not parse.
func logRecord(line string) map[string]string {
	r := map[string]string{}
	rest := strings.TrimSpace(line)
	for rest != "" {
		key, after, ok := strings.Cut(rest, "=")
		if !ok || key == "" || strings.ContainsAny(key, " \"") {
			return nil
		}
		var value string
		if strings.HasPrefix(after, `"`) {
			quoted, err := strconv.QuotedPrefix(after)
			if err != nil {
				return nil
			}
			value, _ = strconv.Unquote(quoted)
			after = after[len(quoted):]
		} else {
			value, after, _ = strings.Cut(after, " ")
			after = " " + after
		}
		r[key] = value
		rest = strings.TrimPrefix(after, " ")
	}
	return r
}

// logRecords are the records of out, in order, that parse.
func logRecords(out string) []map[string]string {
	var rs []map[string]string
	for line := range strings.Lines(out) {
		if r := logRecord(line); r != nil {
			rs = append(rs, r)
		}
	}
	return rs
}

// findRecord is the first record of out whose msg is msg, or nil.
func findRecord(out, msg string) map[string]string {
	for _, r := range logRecords(out) {
		if r["msg"] == msg {
			return r
		}
	}
	return nil
}

// checkRecord reports every attribute of want that r does not hold as want says.
func checkRecord(t *testing.T, what string, r map[string]string, want map[string]string) {
	t.Helper()
	if r == nil {
		t.Errorf("no %s line", what)
		return
	}
	for k, v := range want {
		if r[k] != v {
			t.Errorf("the %s line's %s: %q, want %q (the line: %v)", what, k, r[k], v, r)
		}
	}
}

// TestLifecycleLog: at the default LOG_LEVEL, the command says what it does as a whole. Once
// serving, a line names the address of each listener (gRPC, HTTP, debug, Prometheus), the
// Valkey, and the configuration (its directory, domains and number of rules); a configuration
// loaded later is named the same way; SIGTERM logs the start of the drain, with its cause,
// and the exit, after which the process exits 0 with nothing more to say. The default hides
// info: none of these is at info, and nothing else is either.
func TestLifecycleLog(t *testing.T) {
	valkeytest.SkipIfShort(t, "runs the strictrate-rls command as a process")
	t.Parallel()
	root := t.TempDir()
	file := filepath.Join(root, "ratelimit", "config", "edge.yaml")
	writeFile(t, file, edgeConfig(5))
	e := fileEnv(t, root)
	if _, set := e["LOG_LEVEL"]; set {
		t.Fatal("fileEnv sets LOG_LEVEL; this test needs the default")
	}
	p := start(t, e)
	p.waitLog("msg=serving")
	dir := filepath.Join(root, "ratelimit", "config")
	checkRecord(t, "serving", findRecord(p.log.String(), "serving"), map[string]string{
		"level":      "WARN",
		"grpc":       p.grpc,
		"http":       p.http,
		"debug":      p.debug,
		"prometheus": p.prometheus + "/metrics",
		"valkey":     server.Addr,
		"config":     "files:" + dir,
		"domains":    "edge",
		"rules":      "1",
	})

	// A second domain, loaded while serving.
	writeFile(t, filepath.Join(dir, "api.yaml"), strings.ReplaceAll(edgeConfig(7), "domain: edge", "domain: api"))
	p.waitLog("rate limit configuration reloaded")
	checkRecord(t, "reloaded", findRecord(p.log.String(), "rate limit configuration reloaded"), map[string]string{
		"level":   "WARN",
		"config":  "files:" + dir,
		"domains": "api,edge",
		"rules":   "2",
	})

	sent := time.Now()
	p.terminate()
	if code := p.wait(drainTimeout + 2*time.Second); code != 0 {
		t.Errorf("exit code after SIGTERM: %d, want 0", code)
	}
	took := time.Since(sent)
	out := p.log.String()
	checkRecord(t, "drain", findRecord(out, "shutting down: draining requests in flight"), map[string]string{
		"level":   "WARN",
		"cause":   "terminated signal received",
		"timeout": drainTimeout.String(),
	})
	records := logRecords(out)
	last := records[len(records)-1]
	checkRecord(t, "last", last, map[string]string{"level": "WARN", "msg": "stopped", "drained": "true"})
	if d, err := time.ParseDuration(last["took"]); err != nil || d < 0 || d > took {
		t.Errorf("the stopped line's took: %q, want a duration of at most %v", last["took"], took)
	}
	for _, r := range records {
		if r["level"] == "INFO" || r["level"] == "DEBUG" {
			t.Errorf("a line at %s at the default LOG_LEVEL: %v", r["level"], r)
		}
	}
}
