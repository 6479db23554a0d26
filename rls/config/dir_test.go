package config_test

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"testing"

	"github.com/strictrate/strictrate/rls/config"
)

func domainYAML(domain string, rpu int) string {
	return "domain: " + domain + "\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: " +
		strconv.Itoa(rpu) + "}\n"
}

func write(t *testing.T, path, data string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
}

func symlink(t *testing.T, target, link string) {
	t.Helper()
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
}

func TestLoadDir(t *testing.T) {
	dir := t.TempDir()
	write(t, filepath.Join(dir, "a.yaml"), domainYAML("a", 1))
	write(t, filepath.Join(dir, "sub", "b.yml"), domainYAML("b", 2))
	write(t, filepath.Join(dir, "c.conf"), domainYAML("c", 3)) // any name, as the reference reads
	write(t, filepath.Join(dir, ".hidden.yaml"), domainYAML("a", 4))
	write(t, filepath.Join(dir, ".git", "x.yaml"), domainYAML("b", 5))
	other := t.TempDir()
	write(t, filepath.Join(other, "linked.yaml"), domainYAML("linked", 6))
	write(t, filepath.Join(other, "sub", "notread.yaml"), domainYAML("notread", 7))
	symlink(t, filepath.Join(other, "linked.yaml"), filepath.Join(dir, "link.yaml"))
	symlink(t, filepath.Join(other, "sub"), filepath.Join(dir, "linkdir"))
	symlink(t, filepath.Join(other, "gone.yaml"), filepath.Join(dir, "broken.yaml"))

	c, err := config.LoadDir(dir, true)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := c.Domains(), []string{"a", "b", "c", "linked"}; !slices.Equal(got, want) {
		t.Errorf("Domains = %v, want %v", got, want)
	}
	if m := c.Match("a", e("k", "v")); m.Limit == nil || m.Limit.RequestsPerUnit != 1 {
		t.Errorf("a = %+v", m.Limit)
	}

	// Dot files read: "a" is defined twice, and the message names the second file read, in
	// lexical order (".git/x.yaml", ".hidden.yaml", "a.yaml").
	_, err = config.LoadDir(dir, false)
	var ce *config.Error
	if !errors.As(err, &ce) || !errors.Is(err, config.ErrInvalid) {
		t.Fatalf("with dot files: %v", err)
	}
	if ce.File != "a.yaml" || ce.Reason != "duplicate domain 'a' in config file" {
		t.Errorf("with dot files: %+v", *ce)
	}

	// The directory itself may be a link.
	link := filepath.Join(t.TempDir(), "current")
	symlink(t, dir, link)
	if c, err := config.LoadDir(link, true); err != nil || len(c.Domains()) != 4 {
		t.Errorf("through a link: %v, %v", c.Domains(), err)
	}

	// A directory that does not exist, or is empty, has no domains.
	for _, d := range []string{filepath.Join(dir, "missing"), t.TempDir()} {
		c, err := config.LoadDir(d, true)
		if err != nil || len(c.Domains()) != 0 {
			t.Errorf("%s: %v, %v", d, c.Domains(), err)
		}
	}

	// Not a directory.
	if _, err := config.LoadDir(filepath.Join(dir, "a.yaml"), true); err == nil || errors.Is(err, config.ErrInvalid) {
		t.Errorf("a file as the directory: %v", err)
	}

	// A file that is not the format is refused, named by its path in the directory.
	write(t, filepath.Join(dir, "sub", "README"), "Rate limits live here.\n")
	_, err = config.LoadDir(dir, true)
	if !errors.As(err, &ce) || ce.File != "sub/README" {
		t.Errorf("README: %v", err)
	}
}

func TestLoadDirUnreadable(t *testing.T) {
	if os.Geteuid() == 0 {
		t.Skip("root reads any file")
	}
	dir := t.TempDir()
	write(t, filepath.Join(dir, "a.yaml"), domainYAML("a", 1))
	if err := os.Chmod(filepath.Join(dir, "a.yaml"), 0); err != nil {
		t.Fatal(err)
	}
	if _, err := config.LoadDir(dir, true); err == nil || errors.Is(err, config.ErrInvalid) {
		t.Errorf("unreadable file: %v", err)
	}
}
