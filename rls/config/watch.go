package config

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"time"

	"github.com/fsnotify/fsnotify"
)

// DefaultDebounce is how long Watch waits after a change before reloading, so that a file
// written in several steps, or a directory swapped in several operations, is read once and
// whole.
const DefaultDebounce = 100 * time.Millisecond

// WatchOptions say which directory Watch reads and how, with the reference's settings.
type WatchOptions struct {
	// Root, Subdirectory and AppDirectory are RUNTIME_ROOT, RUNTIME_SUBDIRECTORY and
	// RUNTIME_APPDIRECTORY (the reference's default for the last is "config"): the files are
	// read from their join, Dir, in both modes. (With RUNTIME_WATCH_ROOT the reference reads
	// the files of Root/Subdirectory whose path starts with "AppDirectory.", which is Dir's
	// files plus any named like "config.yaml" beside Dir, and nothing at all when Subdirectory
	// is empty.)
	Root, Subdirectory, AppDirectory string
	// WatchRoot is RUNTIME_WATCH_ROOT. True: reload when Root itself is replaced, as a
	// deployment swaps a symbolic link to a new tree ("current" -> "v2"); changes inside the
	// tree are not watched. False: reload on any change of an entry of Dir (a file written,
	// created, removed, renamed or its mode changed; a ConfigMap's "..data" link swapped), and
	// when Dir itself is created, removed or replaced.
	WatchRoot bool
	// IgnoreDotFiles is RUNTIME_IGNOREDOTFILES (see LoadDir).
	IgnoreDotFiles bool
	// MergeDomains is MERGE_DOMAIN_CONFIG (see WithMergeDomains).
	MergeDomains bool
	// Calendar is STRICTRATE_CALENDAR (see WithCalendar).
	Calendar bool
	// Debounce is the wait after a change before reloading; DefaultDebounce when 0.
	Debounce time.Duration
}

// Dir is the directory the files are read from.
func (w WatchOptions) Dir() string {
	return filepath.Join(w.Root, w.Subdirectory, w.AppDirectory)
}

// Watch loads the directory (LoadDir), then again after every change WatchOptions.WatchRoot
// says to watch, until ctx ends. Each load calls onLoad with the new Config, or onError with
// why it failed: a refused configuration (errors.Is(err, ErrInvalid)) or a failure to read
// or watch the files. It keeps nothing: the caller keeps the last good Config, so a bad edit
// changes nothing until it is fixed. Callbacks are called one at a time, from Watch's
// goroutine; either may be nil.
//
// Watch fails at once when the directory that holds what it watches (Root's parent with
// WatchRoot, Dir's parent without) cannot be watched; otherwise it returns nil when ctx ends.
func Watch(ctx context.Context, w WatchOptions, onLoad func(*Config), onError func(error)) error {
	if onLoad == nil {
		onLoad = func(*Config) {}
	}
	if onError == nil {
		onError = func(error) {}
	}
	debounce := w.Debounce
	if debounce <= 0 {
		debounce = DefaultDebounce
	}
	dir := filepath.Clean(w.Dir())
	trigger := dir // the path whose replacement means a reload
	if w.WatchRoot {
		trigger = filepath.Clean(w.Root)
	}
	watcher, err := fsnotify.NewWatcher()
	if err != nil {
		return fmt.Errorf("config: watch %s: %w", trigger, err)
	}
	defer watcher.Close()
	if err := watcher.Add(filepath.Dir(trigger)); err != nil {
		return fmt.Errorf("config: watch %s: %w", filepath.Dir(trigger), err)
	}
	var opts []Option
	if w.MergeDomains {
		opts = append(opts, WithMergeDomains(true))
	}
	if w.Calendar {
		opts = append(opts, WithCalendar(true))
	}
	load := func() {
		if !w.WatchRoot {
			// Watch Dir afresh: it may have been created or replaced since it was last watched,
			// and a watch follows what a path named when it was added. It may not exist yet:
			// its creation is seen in its parent.
			_ = watcher.Remove(dir)
			_ = watcher.Add(dir)
		}
		c, err := LoadDir(dir, w.IgnoreDotFiles, opts...)
		if err != nil {
			onError(err)
			return
		}
		onLoad(c)
	}
	relevant := func(ev fsnotify.Event) bool {
		name := filepath.Clean(ev.Name)
		if w.WatchRoot {
			return name == trigger && ev.Op&(fsnotify.Create|fsnotify.Write) != 0
		}
		return name == dir || filepath.Dir(name) == dir
	}

	load()
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case ev, ok := <-watcher.Events:
			if !ok {
				return errors.New("config: the watcher closed")
			}
			if relevant(ev) {
				timer.Reset(debounce)
			}
		case err, ok := <-watcher.Errors:
			if !ok {
				return errors.New("config: the watcher closed")
			}
			// Events may have been lost (an overflowing queue): read the files again.
			onError(fmt.Errorf("config: watch %s: %w", trigger, err))
			timer.Reset(debounce)
		case <-timer.C:
			load()
		}
	}
}
