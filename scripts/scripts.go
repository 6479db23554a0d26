// Package scripts holds strictrate's Lua scripts, embedded from the .lua files beside it. It
// is the engine's: Source returns a script the engine runs, and programs have no reason to
// import it.
//
// Each script file opens with a comment that lists its KEYS, ARGV and reply; the engine
// package is the only code that should depend on those shapes. The decision scripts share one
// encoding of their replies (lib_reply.lua), which the engine decodes in one place. EVALSHA runs a script as one
// self-contained text, so code that several scripts share lives in part files (lib_*.lua),
// and a script names each part it uses on a line of its own:
//
//	-- include: lib_request.lua
//
// A part may include parts in turn, one level deep (a part that a part includes includes
// none): lib_log.lua assembles the body of its general() so, one concept per file. No part
// is included twice in one script.
//
// A file may name constants, one per line (the name, then its value as Lua text):
//
//	--const OPEN_CHUNK_MAX 32
//
// Source returns the composed text: each include line replaced by the part it names, and each
// constant's name replaced by its value in every line of code (comment lines keep the name). That text is what the server loads and what its SHA-1 digest is taken of. A
// constant written out costs a call nothing; a Lua local would be an upvalue of every
// function that uses it, made anew on each call.
package scripts

import (
	"embed"
	"fmt"
	"io/fs"
	"regexp"
	"strings"
	"sync"
)

//go:embed *.lua
var files embed.FS

// includePrefix starts a line that a part's text replaces.
const includePrefix = "-- include: "

// constPrefix starts a line that names a constant: the name, a space, its value.
const constPrefix = "--const "

// shebangPrefix starts a script's flags line (Valkey 7 and later), "#!lua flags=...", which the
// server reads only as the script's very first line: the batch scripts carry one
// (allow-cross-slot-keys, and no-writes for the read-only one). Composition keeps a file's first
// line first, and refuses a part that carries one, which would land mid-script.
const shebangPrefix = "#!"

// Source returns the script name (its file's name without ".lua": "decide", "decide_batch",
// "peek", "peek_batch", "decide_all", "settle", "inspect", "lease_acquire", "lease_extend",
// "lease_release" or "probe") composed: each include line replaced by its part, each constant
// by its value. It is composed once per process. Source panics for a name the package does
// not have: the engine names its scripts, and the package's tests compose every one.
func Source(name string) string {
	f, ok := composed[name+".lua"]
	if !ok {
		panic(fmt.Sprintf("scripts: %s.lua is not among scriptFiles", name))
	}
	return f()
}

// scriptFiles are the scripts Source returns, each composed once per process on
// first use: the text depends on the embedded files alone, and composing it takes a few
// regular expressions, which a program making many engines (or a test) would otherwise pay
// for each one.
var scriptFiles = []string{"decide.lua", "peek.lua", "decide_batch.lua", "peek_batch.lua", "decide_all.lua", "settle.lua",
	"inspect.lua", "lease_acquire.lua", "lease_extend.lua", "lease_release.lua", "probe.lua"}

// composed holds, per script file, its composition; it is made at start and only read after.
var composed = func() map[string]func() string {
	m := map[string]func() string{}
	for _, name := range scriptFiles {
		m[name] = sync.OnceValue(func() string {
			src, err := compose(name)
			if err != nil {
				panic(err)
			}
			return src
		})
	}
	return m
}()

// compose returns the named file with every include line replaced by the named part (and
// the part's own include lines by theirs).
func compose(name string) (string, error) { return composeWith(name, nil) }

// composeWith is compose with the constants named in values set to those values instead of
// the ones their lines give (each must be defined; its line is rewritten to say so).
func composeWith(name string, values map[string]string) (string, error) {
	return composeFrom(files, name, values)
}

// maxIncludeDepth is how deep includes nest: a script includes parts (depth 1), which may
// include parts (depth 2), which include none.
const maxIncludeDepth = 2

// composeFrom is composeWith on the files of fsys.
func composeFrom(fsys fs.FS, name string, values map[string]string) (string, error) {
	src, err := fs.ReadFile(fsys, name)
	if err != nil {
		return "", fmt.Errorf("scripts: %w", err)
	}
	var b strings.Builder
	if err := expandIncludes(&b, fsys, name, string(src), 0, map[string]string{}); err != nil {
		return "", err
	}
	text := []byte(b.String())
	for c, v := range values {
		line := regexp.MustCompile(`(?m)^` + constPrefix + c + ` .*$`)
		if !line.Match(text) {
			return "", fmt.Errorf("scripts: %s defines no constant %s to set", name, c)
		}
		text = line.ReplaceAll(text, []byte(constPrefix+c+" "+v))
	}
	return substituteConstants(string(text))
}

// expandIncludes writes src, the text of file name at include depth depth (0: the script
// itself), to b, each include line replaced by its part's text, expanded in turn. included
// maps each part the script has included so far to the file that included it.
func expandIncludes(b *strings.Builder, fsys fs.FS, name, src string, depth int, included map[string]string) error {
	for _, line := range strings.SplitAfter(src, "\n") {
		part, ok := strings.CutPrefix(strings.TrimRight(line, "\r\n"), includePrefix)
		if !ok {
			b.WriteString(line)
			continue
		}
		part = strings.TrimSpace(part)
		if depth >= maxIncludeDepth {
			return fmt.Errorf("scripts: %s, a part that a part includes, includes %s: parts nest one level, so include %s beside %s", name, part, part, name)
		}
		if by, dup := included[part]; dup {
			return fmt.Errorf("scripts: %s includes %s, which %s included already: include each part once", name, part, by)
		}
		included[part] = name
		text, err := fs.ReadFile(fsys, part)
		if err != nil {
			return fmt.Errorf("scripts: %s includes %w", name, err)
		}
		if strings.HasPrefix(string(text), shebangPrefix) || strings.Contains(string(text), "\n"+shebangPrefix) {
			return fmt.Errorf("scripts: part %s carries a shebang line; only a script's first line may", part)
		}
		if err := expandIncludes(b, fsys, part, string(text), depth+1, included); err != nil {
			return err
		}
	}
	return nil
}

// constName is the shape of a constant's name: capitals, digits and underscores.
var constName = regexp.MustCompile(`^[A-Z][A-Z0-9_]*$`)

// substituteConstants writes every constant's value (constPrefix lines) in place of its name
// in the lines of src that are code: a line that opens with "--" is a comment, and keeps it.
func substituteConstants(src string) (string, error) {
	values, err := constantsOf(src)
	if err != nil {
		return "", err
	}
	return applyConstants(src, values), nil
}

// constantsOf returns the constants src defines, by name.
func constantsOf(src string) (map[string]string, error) {
	values := map[string]string{}
	for _, line := range strings.Split(src, "\n") {
		def, ok := strings.CutPrefix(line, constPrefix)
		if !ok {
			continue
		}
		name, value, _ := strings.Cut(def, " ")
		value = strings.TrimSpace(value)
		if !constName.MatchString(name) || value == "" {
			return nil, fmt.Errorf("scripts: constant line %q: want %sNAME value", line, constPrefix)
		}
		if old, dup := values[name]; dup && old != value {
			return nil, fmt.Errorf("scripts: constant %s is %s and %s", name, old, value)
		}
		values[name] = value
	}
	return values, nil
}

// applyConstants writes values in place of their names in the code lines of src.
func applyConstants(src string, values map[string]string) string {
	if len(values) == 0 {
		return src
	}
	names := make([]string, 0, len(values))
	for name := range values {
		names = append(names, name)
	}
	pattern := regexp.MustCompile(`\b(` + strings.Join(names, "|") + `)\b`)
	lines := strings.SplitAfter(src, "\n")
	for i, line := range lines {
		if !strings.HasPrefix(strings.TrimSpace(line), "--") {
			lines[i] = pattern.ReplaceAllStringFunc(line, func(name string) string { return values[name] })
		}
	}
	return strings.Join(lines, "")
}
