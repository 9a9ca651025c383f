// Package fs is a cold store in a local directory: one file per key, created by
// writing a temporary file, syncing it, and hard-linking it to its final name, so
// that an existing key is never overwritten and a crash never leaves half a file
// under a key. The directories on the way are synced too.
package fs

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	iofs "io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"

	"github.com/holdfast/holdfast/cold"
)

// tmpDir holds files being written; it is not a key (keys have no dot segments
// and this name starts with a dot).
const tmpDir = ".tmp"

// Store is a cold store rooted at a directory.
type Store struct {
	root string
}

// Open returns the store in dir, creating it if needed. Left-over temporary files
// of an earlier crash are removed.
func Open(dir string) (*Store, error) {
	if err := os.MkdirAll(filepath.Join(dir, tmpDir), 0o755); err != nil {
		return nil, fmt.Errorf("cold store %s: %w", dir, err)
	}
	left, _ := filepath.Glob(filepath.Join(dir, tmpDir, "*"))
	for _, p := range left {
		_ = os.Remove(p)
	}
	return &Store{root: dir}, nil
}

func (s *Store) path(key string) string { return filepath.Join(s.root, filepath.FromSlash(key)) }

func (s *Store) Create(ctx context.Context, key string, data []byte) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := cold.CheckKey(key); err != nil {
		return err
	}
	final := s.path(key)
	if err := s.mkdirs(filepath.Dir(final)); err != nil {
		return err
	}
	var rnd [8]byte
	_, _ = rand.Read(rnd[:])
	tmp := filepath.Join(s.root, tmpDir, hex.EncodeToString(rnd[:]))
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o644)
	if err != nil {
		return fmt.Errorf("cold store: %w", err)
	}
	defer os.Remove(tmp)
	if _, err := f.Write(data); err != nil {
		f.Close()
		return fmt.Errorf("cold store: write %s: %w", key, err)
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return fmt.Errorf("cold store: sync %s: %w", key, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("cold store: %w", err)
	}
	if err := os.Link(tmp, final); err != nil {
		if errors.Is(err, iofs.ErrExist) {
			if old, rerr := os.ReadFile(final); rerr == nil && bytes.Equal(old, data) {
				return syncDir(filepath.Dir(final)) // a retry of a create that landed
			}
			return cold.ErrExists
		}
		return fmt.Errorf("cold store: link %s: %w", key, err)
	}
	return syncDir(filepath.Dir(final))
}

// mkdirs creates dir and its missing parents under the root, syncing each parent
// that gained an entry.
func (s *Store) mkdirs(dir string) error {
	if _, err := os.Stat(dir); err == nil {
		return nil
	}
	if dir == s.root || !strings.HasPrefix(dir, s.root) {
		return nil
	}
	if err := s.mkdirs(filepath.Dir(dir)); err != nil {
		return err
	}
	if err := os.Mkdir(dir, 0o755); err != nil && !errors.Is(err, iofs.ErrExist) {
		return fmt.Errorf("cold store: %w", err)
	}
	return syncDir(filepath.Dir(dir))
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("cold store: %w", err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil && !errors.Is(err, syscall.EINVAL) {
		return fmt.Errorf("cold store: sync directory: %w", err)
	}
	return nil
}

func (s *Store) Get(ctx context.Context, key string) ([]byte, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if err := cold.CheckKey(key); err != nil {
		return nil, err
	}
	b, err := os.ReadFile(s.path(key))
	if errors.Is(err, iofs.ErrNotExist) || errors.Is(err, syscall.EISDIR) || errors.Is(err, syscall.ENOTDIR) {
		return nil, cold.ErrNotFound
	}
	if err != nil {
		return nil, fmt.Errorf("cold store: read %s: %w", key, err)
	}
	return b, nil
}

func (s *Store) Stat(ctx context.Context, key string) (cold.Info, error) {
	if err := ctx.Err(); err != nil {
		return cold.Info{}, err
	}
	if err := cold.CheckKey(key); err != nil {
		return cold.Info{}, err
	}
	st, err := os.Stat(s.path(key))
	if errors.Is(err, iofs.ErrNotExist) || errors.Is(err, syscall.ENOTDIR) || (err == nil && st.IsDir()) {
		return cold.Info{}, cold.ErrNotFound
	}
	if err != nil {
		return cold.Info{}, fmt.Errorf("cold store: stat %s: %w", key, err)
	}
	return cold.Info{Key: key, Size: st.Size()}, nil
}

func (s *Store) List(ctx context.Context, prefix string) ([]cold.Info, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	// Walk the deepest directory the prefix names in full.
	start := s.root
	if i := strings.LastIndex(prefix, "/"); i >= 0 {
		start = s.path(prefix[:i])
	}
	var out []cold.Info
	err := filepath.WalkDir(start, func(p string, d iofs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, iofs.ErrNotExist) {
				return nil
			}
			return err
		}
		if d.IsDir() {
			if p == filepath.Join(s.root, tmpDir) {
				return filepath.SkipDir
			}
			return nil
		}
		rel, err := filepath.Rel(s.root, p)
		if err != nil {
			return err
		}
		key := filepath.ToSlash(rel)
		if !strings.HasPrefix(key, prefix) {
			return nil
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		out = append(out, cold.Info{Key: key, Size: info.Size()})
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("cold store: list %q: %w", prefix, err)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Key < out[j].Key })
	return out, nil
}

func (s *Store) Delete(ctx context.Context, key string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := cold.CheckKey(key); err != nil {
		return err
	}
	err := os.Remove(s.path(key))
	if err != nil && !errors.Is(err, iofs.ErrNotExist) {
		return fmt.Errorf("cold store: delete %s: %w", key, err)
	}
	if err == nil {
		return syncDir(filepath.Dir(s.path(key)))
	}
	return nil
}
