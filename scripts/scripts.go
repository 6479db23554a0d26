// Package scripts holds strictrate's Lua scripts, embedded from the .lua files beside it.
//
// Each script file opens with a comment that lists its KEYS, ARGV and reply; the engine
// package is the only code that should depend on those shapes. EVALSHA runs a script as one
// self-contained text, so code that several scripts share lives in part files (lib_*.lua),
// and a script names each part it uses on a line of its own:
//
//	-- include: lib_request.lua
//
// The functions here return the composed text, each such line replaced by the part it names:
// that text is what the server loads and what its SHA-1 digest is taken of.
package scripts

import (
	"embed"
	"fmt"
	"strings"
)

//go:embed *.lua
var files embed.FS

// includePrefix starts a line that a part's text replaces.
const includePrefix = "-- include: "

// Decide returns the source of the atomic decision script: trim the log, count every limit's
// window, add the request's entry only when every limit has room, and set the key's expiry,
// all in one call.
func Decide() string { return mustCompose("decide.lua") }

// Peek returns the source of the read-only script that takes the same decision as Decide
// without recording anything.
func Peek() string { return mustCompose("peek.lua") }

// DecideBatch returns the source of the script that takes several decisions in one call, each
// as Decide takes it, in order: the engine's group commit.
func DecideBatch() string { return mustCompose("decide_batch.lua") }

// PeekBatch returns the source of the read-only script that takes several peeks in one call.
func PeekBatch() string { return mustCompose("peek_batch.lua") }

// Settle returns the source of the script that lowers an admitted request's entry to the cost
// it ended with, or refunds it.
func Settle() string { return mustCompose("settle.lua") }

// Inspect returns the source of the read-only script that returns a key's log as stored: its
// header's totals and each entry's time and cost.
func Inspect() string { return mustCompose("inspect.lua") }

// LeaseAcquire returns the source of the script that takes a slot of a key's in-flight limit:
// drop the expired leases, count the rest, add the new lease only when fewer than max are
// held, and keep the key until its last lease expires, all in one call.
func LeaseAcquire() string { return mustCompose("lease_acquire.lua") }

// LeaseExtend returns the source of the script that moves a held lease's expiry, and refuses
// one that has expired or was released.
func LeaseExtend() string { return mustCompose("lease_extend.lua") }

// LeaseRelease returns the source of the script that removes one lease by its id.
func LeaseRelease() string { return mustCompose("lease_release.lua") }

// Probe returns probe.lua: which commands the scripts run the caller's user may not run, for
// the engine's check in New.
func Probe() string { return mustCompose("probe.lua") }

// mustCompose composes an embedded script. The files are compiled in, so a missing part is a
// defect of the build that the package's tests catch; it panics rather than return a script
// that cannot run.
func mustCompose(name string) string {
	src, err := compose(name)
	if err != nil {
		panic(err)
	}
	return src
}

// compose returns the named file with every include line replaced by the named part. Parts
// do not include other parts: a script lists everything it uses, in order.
func compose(name string) (string, error) {
	src, err := files.ReadFile(name)
	if err != nil {
		return "", fmt.Errorf("scripts: %w", err)
	}
	var b strings.Builder
	for _, line := range strings.SplitAfter(string(src), "\n") {
		part, ok := strings.CutPrefix(strings.TrimRight(line, "\r\n"), includePrefix)
		if !ok {
			b.WriteString(line)
			continue
		}
		text, err := files.ReadFile(strings.TrimSpace(part))
		if err != nil {
			return "", fmt.Errorf("scripts: %s includes %w", name, err)
		}
		if strings.Contains(string(text), "\n"+includePrefix) {
			return "", fmt.Errorf("scripts: part %s includes another part; list every part in %s", part, name)
		}
		b.Write(text)
	}
	return b.String(), nil
}
