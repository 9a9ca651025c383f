// Package coldtest is the conformance suite of cold stores: every implementation
// runs Run against a fresh, empty store (or one whose keys under prefix are its own).
package coldtest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/holdfast/holdfast/cold"
)

// Run runs the conformance suite against s. Keys start with prefix, so that a
// shared bucket can hold several runs; prefix ends with "/" or is empty.
func Run(t *testing.T, s cold.Store, prefix string) {
	ctx := func(t *testing.T) context.Context {
		c, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		t.Cleanup(cancel)
		return c
	}
	k := func(name string) string { return prefix + name }

	t.Run("CreateThenGetStat", func(t *testing.T) {
		c := ctx(t)
		data := []byte("segment one")
		if err := s.Create(c, k("a/seg/1"), data); err != nil {
			t.Fatal(err)
		}
		got, err := s.Get(c, k("a/seg/1"))
		if err != nil || !bytes.Equal(got, data) {
			t.Fatalf("get: %q %v", got, err)
		}
		info, err := s.Stat(c, k("a/seg/1"))
		if err != nil || info.Key != k("a/seg/1") || info.Size != int64(len(data)) {
			t.Fatalf("stat: %+v %v", info, err)
		}
		empty := k("a/seg/empty")
		if err := s.Create(c, empty, nil); err != nil {
			t.Fatal(err)
		}
		if got, err := s.Get(c, empty); err != nil || len(got) != 0 {
			t.Fatalf("empty object: %q %v", got, err)
		}
		big := bytes.Repeat([]byte("0123456789abcdef"), 1<<16) // 1 MiB
		if err := s.Create(c, k("a/seg/big"), big); err != nil {
			t.Fatal(err)
		}
		if got, err := s.Get(c, k("a/seg/big")); err != nil || !bytes.Equal(got, big) {
			t.Fatalf("1 MiB object: %d bytes, %v", len(got), err)
		}
	})

	t.Run("CreateNeverOverwrites", func(t *testing.T) {
		c := ctx(t)
		key := k("b/seg/1")
		if err := s.Create(c, key, []byte("first")); err != nil {
			t.Fatal(err)
		}
		if err := s.Create(c, key, []byte("second")); !errors.Is(err, cold.ErrExists) {
			t.Fatalf("second create: %v, want ErrExists", err)
		}
		if got, _ := s.Get(c, key); string(got) != "first" {
			t.Fatalf("after a refused create: %q", got)
		}
		// A create of the same bytes again is a retry: nil or ErrExists, never a change.
		if err := s.Create(c, key, []byte("first")); err != nil && !errors.Is(err, cold.ErrExists) {
			t.Fatalf("same-content create: %v", err)
		}
	})

	t.Run("LargeObjectNeverOverwritten", func(t *testing.T) {
		// 17 MiB: past minio-go's multipart threshold (16 MiB), where a client that
		// sends the condition only when a multipart upload starts would let a
		// server that checks at completion overwrite silently.
		c := ctx(t)
		key := k("b/large")
		first := bytes.Repeat([]byte("a"), 17<<20)
		if err := s.Create(c, key, first); err != nil {
			t.Fatal(err)
		}
		second := bytes.Repeat([]byte("b"), 17<<20)
		if err := s.Create(c, key, second); !errors.Is(err, cold.ErrExists) {
			t.Fatalf("second create of a large object: %v, want ErrExists", err)
		}
		if got, err := s.Get(c, key); err != nil || !bytes.Equal(got, first) {
			t.Fatalf("large object after a refused create: %d bytes, %v", len(got), err)
		}
	})

	t.Run("ConcurrentCreateOneWinner", func(t *testing.T) {
		c := ctx(t)
		key := k("c/race")
		const racers = 8
		var wg sync.WaitGroup
		errs := make([]error, racers)
		for i := 0; i < racers; i++ {
			wg.Add(1)
			go func(i int) {
				defer wg.Done()
				errs[i] = s.Create(c, key, []byte(fmt.Sprintf("racer %d", i)))
			}(i)
		}
		wg.Wait()
		winner := -1
		for i, err := range errs {
			switch {
			case err == nil:
				if winner >= 0 {
					t.Fatalf("racers %d and %d both created %s", winner, i, key)
				}
				winner = i
			case !errors.Is(err, cold.ErrExists):
				t.Fatalf("racer %d: %v", i, err)
			}
		}
		if winner < 0 {
			t.Fatal("no racer created the key")
		}
		if got, _ := s.Get(c, key); string(got) != fmt.Sprintf("racer %d", winner) {
			t.Fatalf("stored %q, the winner was racer %d", got, winner)
		}
	})

	t.Run("MissingKeys", func(t *testing.T) {
		c := ctx(t)
		if _, err := s.Get(c, k("d/none")); !errors.Is(err, cold.ErrNotFound) {
			t.Fatalf("get: %v, want ErrNotFound", err)
		}
		if _, err := s.Stat(c, k("d/none")); !errors.Is(err, cold.ErrNotFound) {
			t.Fatalf("stat: %v, want ErrNotFound", err)
		}
		if l, err := s.List(c, k("d/")); err != nil || len(l) != 0 {
			t.Fatalf("list of nothing: %v %v", l, err)
		}
	})

	t.Run("ListInKeyOrder", func(t *testing.T) {
		c := ctx(t)
		keys := []string{"e/x/00000000000000000010", "e/x/00000000000000000002", "e/x/00000000000000000100", "e/y/1", "e/xa"}
		for _, key := range keys {
			if err := s.Create(c, k(key), []byte(key)); err != nil {
				t.Fatal(err)
			}
		}
		got, err := s.List(c, k("e/x/"))
		if err != nil {
			t.Fatal(err)
		}
		want := []string{"e/x/00000000000000000002", "e/x/00000000000000000010", "e/x/00000000000000000100"}
		if len(got) != len(want) {
			t.Fatalf("list e/x/: %v", got)
		}
		for i, info := range got {
			if info.Key != k(want[i]) || info.Size != int64(len(want[i])) {
				t.Fatalf("list e/x/ item %d: %+v, want %s", i, info, want[i])
			}
		}
		all, err := s.List(c, k("e/x"))
		if err != nil || len(all) != 4 || all[3].Key != k("e/xa") {
			t.Fatalf("list e/x (a partial segment): %v %v", all, err)
		}
	})

	t.Run("DeleteIsIdempotent", func(t *testing.T) {
		c := ctx(t)
		key := k("f/seg")
		if err := s.Create(c, key, []byte("x")); err != nil {
			t.Fatal(err)
		}
		for i := 0; i < 2; i++ {
			if err := s.Delete(c, key); err != nil {
				t.Fatalf("delete %d: %v", i, err)
			}
		}
		if _, err := s.Get(c, key); !errors.Is(err, cold.ErrNotFound) {
			t.Fatalf("get after delete: %v", err)
		}
		if err := s.Delete(c, k("f/never")); err != nil {
			t.Fatalf("delete of a missing key: %v", err)
		}
		// A deleted key can be created again.
		if err := s.Create(c, key, []byte("y")); err != nil {
			t.Fatalf("create after delete: %v", err)
		}
	})

	t.Run("LongestNames", func(t *testing.T) {
		// Segments of a log whose type and key are the longest names the spec
		// allows (256 bytes; two- and three-byte UTF-8 letters), laid out as
		// the log lays them out (cold.LogSegmentKey): each name cut into two
		// path segments, about 800 bytes in all.
		c := ctx(t)
		app, typ, key := "app_"+strings.Repeat("a", 60), strings.Repeat("é", 128), strings.Repeat("界", 85)+"x"
		seg := func(typ, key string, first uint64) string { return k(cold.LogSegmentKey(app, typ, key, first)) }
		firsts := []uint64{0, 10, 100, 1 << 40}
		for _, first := range firsts {
			if err := s.Create(c, seg(typ, key, first), []byte(fmt.Sprint("segment ", first))); err != nil {
				t.Fatalf("create a segment of 256-byte names (%d bytes): %v", len(seg(typ, key, first)), err)
			}
		}
		// Neighbours: the same type with a key of 191 bytes (the longest in one
		// path segment), of 192 (the shortest in two), and keys whose forms
		// are key's first piece and that piece and a bit more.
		neighbours := []string{strings.Repeat("k", 191), strings.Repeat("k", 192), key[:150], key[:150] + "z"}
		for _, other := range neighbours {
			if err := s.Create(c, seg(typ, other, 0), []byte(other)); err != nil {
				t.Fatalf("create a segment of a %d-byte key: %v", len(other), err)
			}
		}
		got, err := s.Get(c, seg(typ, key, 10))
		if err != nil || string(got) != "segment 10" {
			t.Fatalf("get: %q %v", got, err)
		}
		if info, err := s.Stat(c, seg(typ, key, 100)); err != nil || info.Key != seg(typ, key, 100) || info.Size != int64(len("segment 100")) {
			t.Fatalf("stat: %+v %v", info, err)
		}
		if err := s.Create(c, seg(typ, key, 0), []byte("other")); !errors.Is(err, cold.ErrExists) {
			t.Fatalf("second create: %v, want ErrExists", err)
		}
		// The object's segments, and only those, under its prefix, in order.
		list, err := s.List(c, k(cold.LogObjectPrefix(app, typ, key)))
		if err != nil || len(list) != len(firsts) {
			t.Fatalf("list the object's prefix: %v %v", list, err)
		}
		for i, info := range list {
			if info.Key != seg(typ, key, firsts[i]) {
				t.Fatalf("list item %d: %s, want %s", i, info.Key, seg(typ, key, firsts[i]))
			}
		}
		// The type's segments, across its keys: the prefix of a one-segment
		// key without that segment.
		typePrefix := strings.TrimSuffix(cold.LogObjectPrefix(app, typ, "k"), "/")
		typePrefix = typePrefix[:strings.LastIndex(typePrefix, "/")+1]
		if list, err := s.List(c, k(typePrefix)); err != nil || len(list) != len(firsts)+len(neighbours) {
			t.Fatalf("list the type's prefix: %d keys %v", len(list), err)
		}
		for _, other := range neighbours {
			if got, err := s.Get(c, seg(typ, other, 0)); err != nil || string(got) != other {
				t.Fatalf("get the segment of a %d-byte key: %v", len(other), err)
			}
		}
		if err := s.Delete(c, seg(typ, key, 0)); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Get(c, seg(typ, key, 0)); !errors.Is(err, cold.ErrNotFound) {
			t.Fatalf("get after delete: %v", err)
		}
		// A key past MaxKeyLen (a 256-byte app with those names) is refused
		// whole, by every store alike.
		long := cold.LogSegmentKey(strings.Repeat("a", 256), typ, key, 0)
		if err := s.Create(c, long, []byte("x")); !errors.Is(err, cold.ErrInvalidKey) {
			t.Fatalf("create a %d-byte key: %v, want ErrInvalidKey", len(long), err)
		}
	})

	t.Run("InvalidKeys", func(t *testing.T) {
		c := ctx(t)
		for _, bad := range []string{"", "/a", "a/", "a//b", "a/./b", "a/../b", "..", string(bytes.Repeat([]byte("k"), cold.MaxKeyLen+1)),
			"a/" + strings.Repeat("s", cold.MaxSegmentLen+1) + "/b"} {
			if err := s.Create(c, bad, []byte("x")); !errors.Is(err, cold.ErrInvalidKey) {
				t.Errorf("create %q: %v, want ErrInvalidKey", bad, err)
			}
		}
	})

	t.Run("CancelledContext", func(t *testing.T) {
		c, cancel := context.WithCancel(context.Background())
		cancel()
		if err := s.Create(c, k("g/x"), []byte("x")); err == nil {
			t.Fatal("create with a cancelled context succeeded")
		}
	})
}
