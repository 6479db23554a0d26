package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/strictrate/strictrate/internal/valkeytest"
)

// readmeBlocks returns the README's first Go block and the text block that follows it: the
// front page's example and what it prints.
func readmeBlocks(t *testing.T) (code, output string) {
	t.Helper()
	readme, err := os.ReadFile(filepath.Join("..", "..", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile("(?s)```go\n(.*?)```.*?```text\n(.*?)```").FindSubmatch(readme)
	if m == nil {
		t.Fatal("README.md has no ```go block followed by a ```text block")
	}
	return string(m[1]), string(m[2])
}

// The front page's example is this program, to the byte: it cannot rot apart from it.
func TestTheREADMEShowsThisProgram(t *testing.T) {
	code, _ := readmeBlocks(t)
	src, err := os.ReadFile("main.go")
	if err != nil {
		t.Fatal(err)
	}
	if code != string(src) {
		t.Fatalf("README.md's Go example differs from examples/quickstart/main.go: keep them identical\nREADME:\n%s\nmain.go:\n%s", code, src)
	}
}

// The example, copied into a module of its own as a newcomer would copy it (its go.mod
// requiring this repository's module), builds and prints what the README says, against a real
// Valkey.
func TestTheExampleRunsAsShownInANewModule(t *testing.T) {
	valkeytest.SkipIfShort(t, "builds the example in a module of its own")
	_, want := readmeBlocks(t)
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	src, err := os.ReadFile("main.go")
	if err != nil {
		t.Fatal(err)
	}
	gomod := "module quickstart\n\ngo 1.25.0\n\nrequire github.com/strictrate/strictrate v0.0.0-00010101000000-000000000000\n\n" +
		"replace github.com/strictrate/strictrate => " + root + "\n"
	for name, data := range map[string]string{"main.go": string(src), "go.mod": gomod} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	srv := valkeytest.New(t, valkeytest.OwnServer())
	env := append(os.Environ(), "GOWORK=off", "GOFLAGS=-mod=mod", "VALKEY_ADDR="+srv.Addr)
	for _, args := range [][]string{{"mod", "tidy"}, {"vet", "."}, {"run", "."}} {
		cmd := exec.Command("go", args...)
		cmd.Dir, cmd.Env = dir, env
		var stdout, stderr strings.Builder
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		if err := cmd.Run(); err != nil {
			t.Fatalf("go %s in a new module: %v\n%s%s", strings.Join(args, " "), err, stdout.String(), stderr.String())
		}
		if args[0] == "run" && stdout.String() != want {
			t.Fatalf("the example printed:\n%s\nthe README says:\n%s", stdout.String(), want)
		}
	}
}
