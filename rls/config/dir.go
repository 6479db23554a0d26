package config

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
)

// LoadDir builds a Config from the files under dir, as the reference reads its runtime
// directory ($RUNTIME_ROOT/$RUNTIME_SUBDIRECTORY/$RUNTIME_APPDIRECTORY):
//   - every regular file, whatever its name (not only *.yaml), in every subdirectory, in
//     lexical order of path (the reference's order is a map's, so undefined); each is named
//     in messages by its path relative to dir;
//   - with ignoreDotFiles (RUNTIME_IGNOREDOTFILES), files and directories whose name starts
//     with '.' are skipped: a Kubernetes ConfigMap's "..data" and "..2024_..." entries, so
//     that its files are read once, through their links;
//   - a link to a file is read; a link to a directory is not followed, and a broken link is
//     skipped (the reference skips both; a broken link is a moment of a ConfigMap update);
//     dir itself may be a link;
//   - a dir that does not exist makes a Config without domains, as in the reference, so that
//     the caller decides whether that is healthy.
//
// A file that cannot be read fails the load (the reference skips it: a limit that silently
// vanishes is worse than keeping the last good configuration).
func LoadDir(dir string, ignoreDotFiles bool, opts ...Option) (*Config, error) {
	files, err := readDir(dir, ignoreDotFiles)
	if err != nil {
		return nil, err
	}
	return Parse(files, opts...)
}

func readDir(dir string, ignoreDotFiles bool) ([]File, error) {
	root, err := filepath.EvalSymlinks(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("config: read %s: %w", dir, err)
	}
	info, err := os.Stat(root)
	if err != nil {
		return nil, fmt.Errorf("config: read %s: %w", dir, err)
	}
	if !info.IsDir() {
		return nil, fmt.Errorf("config: read %s: not a directory", dir)
	}
	var files []File
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if path == root {
			return nil
		}
		if ignoreDotFiles && d.Name()[0] == '.' {
			if d.IsDir() {
				return filepath.SkipDir
			}
			return nil
		}
		switch t := d.Type(); {
		case t.IsDir():
			return nil
		case t&fs.ModeSymlink != 0:
			target, err := os.Stat(path)
			if errors.Is(err, fs.ErrNotExist) {
				return nil
			}
			if err != nil {
				return err
			}
			if !target.Mode().IsRegular() {
				return nil
			}
		case !t.IsRegular():
			return nil
		}
		data, err := os.ReadFile(path)
		if errors.Is(err, fs.ErrNotExist) {
			return nil // removed since it was listed: the next event reloads
		}
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(root, path)
		if err != nil {
			return err
		}
		files = append(files, File{Name: filepath.ToSlash(rel), Data: data})
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("config: read %s: %w", dir, err)
	}
	return files, nil
}
