package config_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/strictrate/strictrate/rls/config"
)

// watched runs Watch and collects what it reports.
type watched struct {
	loads  chan *config.Config
	errs   chan error
	result chan error
}

func startWatch(t *testing.T, w config.WatchOptions) *watched {
	t.Helper()
	if w.Debounce == 0 {
		w.Debounce = 20 * time.Millisecond
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &watched{loads: make(chan *config.Config, 100), errs: make(chan error, 100), result: make(chan error, 1)}
	go func() {
		r.result <- config.Watch(ctx, w, func(c *config.Config) { r.loads <- c }, func(err error) { r.errs <- err })
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-r.result:
			if err != nil {
				t.Errorf("Watch returned %v", err)
			}
		case <-time.After(5 * time.Second):
			t.Error("Watch did not return when its context ended")
		}
	})
	return r
}

// rpu waits for a load whose domain d has rule k at requests_per_unit n, and fails on any
// error reported meanwhile.
func (r *watched) waitRPU(t *testing.T, d string, n uint32) {
	t.Helper()
	deadline := time.After(5 * time.Second)
	for {
		select {
		case c := <-r.loads:
			if m := c.Match(d, e("k", "v")); m.Limit != nil && m.Limit.RequestsPerUnit == n {
				return
			}
		case err := <-r.errs:
			t.Fatalf("waiting for %s at %d: %v", d, n, err)
		case <-deadline:
			t.Fatalf("no load of %s at %d", d, n)
		}
	}
}

func (r *watched) waitInvalid(t *testing.T) {
	t.Helper()
	select {
	case err := <-r.errs:
		if !errors.Is(err, config.ErrInvalid) {
			t.Fatalf("error %v is not ErrInvalid", err)
		}
	case c := <-r.loads:
		t.Fatalf("loaded %s, want a refusal", c)
	case <-time.After(5 * time.Second):
		t.Fatal("no refusal reported")
	}
}

func TestWatchDir(t *testing.T) {
	root := t.TempDir()
	w := config.WatchOptions{Root: root, Subdirectory: "ratelimit", AppDirectory: "config"}
	if err := os.MkdirAll(filepath.Join(root, "ratelimit"), 0o755); err != nil {
		t.Fatal(err)
	}
	r := startWatch(t, w)

	// The app directory does not exist yet: no domains.
	select {
	case c := <-r.loads:
		if len(c.Domains()) != 0 {
			t.Fatalf("first load: %v", c.Domains())
		}
	case err := <-r.errs:
		t.Fatal(err)
	case <-time.After(5 * time.Second):
		t.Fatal("no first load")
	}

	// Created with a file in it.
	tmp := filepath.Join(root, "ratelimit", "tmp")
	write(t, filepath.Join(tmp, "a.yaml"), domainYAML("a", 1))
	if err := os.Rename(tmp, w.Dir()); err != nil {
		t.Fatal(err)
	}
	r.waitRPU(t, "a", 1)

	// Changed.
	file := filepath.Join(w.Dir(), "a.yaml")
	replace(t, file, domainYAML("a", 2))
	r.waitRPU(t, "a", 2)

	// A bad edit is reported; the caller keeps the last good config.
	replace(t, file, domainYAML("a", 3)+"  - key: k\n")
	r.waitInvalid(t)

	// Fixed.
	replace(t, file, domainYAML("a", 4))
	r.waitRPU(t, "a", 4)

	// A new file; then removed.
	replace(t, filepath.Join(w.Dir(), "b.yaml"), domainYAML("b", 5))
	r.waitRPU(t, "b", 5)
	if err := os.Remove(filepath.Join(w.Dir(), "b.yaml")); err != nil {
		t.Fatal(err)
	}
	waitFor(t, r, func(c *config.Config) bool { return !c.HasDomain("b") && c.HasDomain("a") })

	// The directory replaced by another: the new one is read and watched.
	next := filepath.Join(root, "ratelimit", "next")
	write(t, filepath.Join(next, "a.yaml"), domainYAML("a", 6))
	if err := os.RemoveAll(w.Dir()); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(next, w.Dir()); err != nil {
		t.Fatal(err)
	}
	r.waitRPU(t, "a", 6)
	replace(t, file, domainYAML("a", 7))
	r.waitRPU(t, "a", 7)
}

// replace writes a file whole, as editors and deployment tools do (a file written in place
// can be read half written, which the reload reports, as the reference would).
func replace(t *testing.T, path, data string) {
	t.Helper()
	tmp := filepath.Join(filepath.Dir(filepath.Dir(path)), ".tmp-"+filepath.Base(path))
	write(t, tmp, data)
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

func waitFor(t *testing.T, r *watched, ok func(*config.Config) bool) {
	t.Helper()
	deadline := time.After(5 * time.Second)
	for {
		select {
		case c := <-r.loads:
			if ok(c) {
				return
			}
		case err := <-r.errs:
			t.Fatal(err)
		case <-deadline:
			t.Fatal("no such load")
		}
	}
}

// TestWatchConfigMap swaps files as Kubernetes updates a mounted ConfigMap: the files are
// links through "..data", a link to a timestamped directory, which is replaced atomically.
func TestWatchConfigMap(t *testing.T) {
	root := t.TempDir()
	w := config.WatchOptions{Root: root, AppDirectory: "config", IgnoreDotFiles: true}
	dir := w.Dir()
	write(t, filepath.Join(dir, "..2024_01", "a.yaml"), domainYAML("a", 1))
	symlink(t, "..2024_01", filepath.Join(dir, "..data"))
	symlink(t, filepath.Join("..data", "a.yaml"), filepath.Join(dir, "a.yaml"))
	r := startWatch(t, w)
	r.waitRPU(t, "a", 1)

	write(t, filepath.Join(dir, "..2024_02", "a.yaml"), domainYAML("a", 2))
	symlink(t, "..2024_02", filepath.Join(dir, "..data_tmp"))
	if err := os.Rename(filepath.Join(dir, "..data_tmp"), filepath.Join(dir, "..data")); err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(filepath.Join(dir, "..2024_01")); err != nil {
		t.Fatal(err)
	}
	r.waitRPU(t, "a", 2)
}

// TestWatchRoot swaps the root, a link to a whole tree, as RUNTIME_WATCH_ROOT deployments do.
func TestWatchRoot(t *testing.T) {
	base := t.TempDir()
	write(t, filepath.Join(base, "v1", "ratelimit", "config", "a.yaml"), domainYAML("a", 1))
	write(t, filepath.Join(base, "v2", "ratelimit", "config", "a.yaml"), domainYAML("a", 2))
	current := filepath.Join(base, "current")
	symlink(t, "v1", current)
	w := config.WatchOptions{Root: current, Subdirectory: "ratelimit", AppDirectory: "config", WatchRoot: true}
	r := startWatch(t, w)
	r.waitRPU(t, "a", 1)

	symlink(t, "v2", filepath.Join(base, "next"))
	if err := os.Rename(filepath.Join(base, "next"), current); err != nil {
		t.Fatal(err)
	}
	r.waitRPU(t, "a", 2)

	// A bad tree swapped in is reported.
	write(t, filepath.Join(base, "v3", "ratelimit", "config", "a.yaml"), "domain: a\nbad: 1\n")
	symlink(t, "v3", filepath.Join(base, "next"))
	if err := os.Rename(filepath.Join(base, "next"), current); err != nil {
		t.Fatal(err)
	}
	r.waitInvalid(t)
}

func TestWatchFailsWithoutParent(t *testing.T) {
	w := config.WatchOptions{Root: filepath.Join(t.TempDir(), "missing"), Subdirectory: "x", AppDirectory: "config"}
	err := config.Watch(context.Background(), w, nil, nil)
	if err == nil {
		t.Fatal("Watch of a directory whose parent is missing succeeded")
	}
}
