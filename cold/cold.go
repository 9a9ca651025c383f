// Package cold is the cold segment store: where the retained log keeps records it
// trimmed from an object, so that they stay readable. This file is the contract;
// NewMemory is an in-memory store, cold/fs keeps segments in a local directory and
// cold/s3 in any S3 server (through minio-go). All of them pass coldtest.Run.
//
// It sits below actors and imports nothing of Holdfast's.
package cold

import (
	"context"
	"errors"
	"fmt"
	"strings"
)

var (
	// ErrExists is returned by Create when the key already exists.
	ErrExists = errors.New("cold: the key already exists")
	// ErrNotFound is returned by Get and Stat for a missing key.
	ErrNotFound = errors.New("cold: not found")
	// ErrInvalidKey is returned for a key that breaks the key rules.
	ErrInvalidKey = errors.New("cold: invalid key")
)

// Info describes one stored object.
type Info struct {
	Key  string
	Size int64
}

// Store is a cold store. Keys are 1 to MaxKeyLen bytes of slash-separated
// segments of at most MaxSegmentLen bytes, none empty, "." or ".."; they never end
// with "/". Every store takes every such key (a store with a prefix of its own
// refuses the keys that do not fit with it). Every method takes ctx first and
// honours its deadline.
type Store interface {
	// Create stores data under key only if key does not exist; otherwise it
	// returns ErrExists and changes nothing. An object is never overwritten. A
	// store may return nil when the key holds exactly data already (a retried
	// create whose first attempt landed).
	Create(ctx context.Context, key string, data []byte) error
	// Get returns the data under key, or ErrNotFound.
	Get(ctx context.Context, key string) ([]byte, error)
	// Stat describes key, or returns ErrNotFound.
	Stat(ctx context.Context, key string) (Info, error)
	// List returns every key that starts with prefix, in byte order.
	List(ctx context.Context, prefix string) ([]Info, error)
	// Delete removes key. Deleting a missing key succeeds.
	Delete(ctx context.Context, key string) error
}

const (
	// MaxKeyLen bounds a key: S3's limit on an object key (a store's own
	// prefix included).
	MaxKeyLen = 1024
	// MaxSegmentLen bounds a key's segment: the file systems' limit on a path
	// component.
	MaxSegmentLen = 255
)

// CheckKey reports whether key follows the key rules.
func CheckKey(key string) error {
	if key == "" || len(key) > MaxKeyLen {
		return fmt.Errorf("%w: %d bytes, want 1 to %d", ErrInvalidKey, len(key), MaxKeyLen)
	}
	for _, seg := range strings.Split(key, "/") {
		if seg == "" || seg == "." || seg == ".." {
			return fmt.Errorf("%w: %q has an empty or dot segment", ErrInvalidKey, key)
		}
		if len(seg) > MaxSegmentLen {
			return fmt.Errorf("%w: a segment of %d bytes, at most %d", ErrInvalidKey, len(seg), MaxSegmentLen)
		}
		if strings.ContainsAny(seg, "\x00\\") {
			return fmt.Errorf("%w: %q holds a NUL or a backslash", ErrInvalidKey, key)
		}
	}
	return nil
}
