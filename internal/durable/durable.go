// Package durable makes directory changes survive a power cut.
//
// POSIX makes a new directory entry durable only once its parent directory is
// fsynced; ext4 and xfs happen to give more (their journals commit entries in
// order), but Holdfast relies only on POSIX's promise (docs/decisions.md,
// "Which guarantees of the filesystem Holdfast relies on"). A data directory
// made at first start and never synced in its parent can vanish at a power
// cut together with every write acknowledged into it.
package durable

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
)

// MkdirAll is os.MkdirAll that leaves every directory it created durable: it
// syncs each new directory and the parent that names it, from the topmost new
// one down. A path that exists already is left alone (it is durable since the
// call that made it returned).
func MkdirAll(path string, perm os.FileMode) error {
	path = filepath.Clean(path)
	var missing []string // from path up to the first existing ancestor
	for p := path; ; p = filepath.Dir(p) {
		st, err := os.Stat(p)
		if err == nil {
			if !st.IsDir() {
				return &fs.PathError{Op: "mkdir", Path: p, Err: errors.New("not a directory")}
			}
			break
		}
		if !errors.Is(err, fs.ErrNotExist) {
			return err
		}
		missing = append(missing, p)
		if filepath.Dir(p) == p {
			break
		}
	}
	if len(missing) == 0 {
		return nil
	}
	if err := os.MkdirAll(path, perm); err != nil {
		return err
	}
	for i := len(missing) - 1; i >= 0; i-- {
		if err := SyncDir(filepath.Dir(missing[i])); err != nil {
			return err
		}
	}
	return SyncDir(path)
}

// SyncDir fsyncs the directory at path, so that the entries in it are durable.
func SyncDir(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := f.Sync(); err != nil {
		return fmt.Errorf("sync directory %s: %w", path, err)
	}
	return nil
}
