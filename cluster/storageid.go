package cluster

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/holdfast/holdfast/internal/durable"
)

// A data directory's storage ID names the disk a node's partitions are served
// from. It is made once, at random, when the directory is first opened (a
// directory from an older version, which has data and no ID, gets one then
// too), and never changes: a node whose directory was wiped, replaced or mixed
// up comes back with another ID. The cluster records the ID a partition is
// served from (PartEntry.Storage) and a node refuses to serve a partition
// recorded under another ID (docs/decisions.md, "Storage identity before
// replication").

// storageIDFile is the storage ID's file in the data directory.
const storageIDFile = "storage-id"

// storageIDLen is the length of a storage ID: 16 random bytes in hex.
const storageIDLen = 32

// loadStorageID returns dir's storage ID, making and durably recording a new
// one if dir has none. dir must exist. A damaged ID file stops start-up: a new
// ID would make the node refuse its own partitions, and guessing is worse.
func loadStorageID(dir string) (string, error) {
	path := filepath.Join(dir, storageIDFile)
	b, err := os.ReadFile(path)
	switch {
	case err == nil:
		id := strings.TrimSpace(string(b))
		if !validStorageID(id) {
			return "", fmt.Errorf("data directory %s: %s holds %q, not a storage ID (32 hex digits); restore it from a backup of this directory", dir, storageIDFile, truncate(id, 64))
		}
		return id, nil
	case !errors.Is(err, fs.ErrNotExist):
		return "", fmt.Errorf("data directory %s: read its storage ID: %w", dir, err)
	}
	var r [storageIDLen / 2]byte
	if _, err := rand.Read(r[:]); err != nil {
		return "", err
	}
	id := hex.EncodeToString(r[:])
	// Written whole to a temporary file, synced, renamed over, and the rename
	// made durable: a crash leaves either no ID (made again next time, before
	// anything was served under it) or the whole ID.
	tmp := path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o644)
	if err != nil {
		return "", fmt.Errorf("data directory %s: record its storage ID: %w", dir, err)
	}
	_, err = f.WriteString(id + "\n")
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err == nil {
		err = durable.SyncDir(dir)
	}
	if err != nil {
		_ = os.Remove(tmp)
		return "", fmt.Errorf("data directory %s: record its storage ID: %w", dir, err)
	}
	return id, nil
}

func validStorageID(id string) bool {
	if len(id) != storageIDLen {
		return false
	}
	_, err := hex.DecodeString(id)
	return err == nil
}

func truncate(s string, n int) string {
	if len(s) > n {
		return s[:n] + "…"
	}
	return s
}

// refusedBy reports whether partition entry e may not be served from the data
// directory whose storage ID is storage: e was served from another one. An
// entry or a node without an ID (a cluster or node of an older version) is
// never refused: the next take-up records the ID it is served from.
func refusedBy(e PartEntry, storage string) bool {
	return e.Storage != "" && storage != "" && e.Storage != storage
}
