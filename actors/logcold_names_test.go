package actors

import (
	"context"
	"encoding/base64"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/holdfast/holdfast/cold"
	coldfs "github.com/holdfast/holdfast/cold/fs"
)

// Issue 26, point 4: cold paths of long names.

// longName is n bytes of valid UTF-8: two-byte letters, an ASCII letter to
// make up an odd n.
func longName(n int, r rune) string {
	s := strings.Repeat(string(r), n/2)
	if n%2 == 1 {
		s += "x"
	}
	return s
}

// oldSegmentKey is segmentKey as it was before issue 26: every name one
// base64url path segment, which the file system refuses past 255 bytes.
func oldSegmentKey(id ObjectID, first uint64) string {
	enc := base64.RawURLEncoding
	return fmt.Sprintf("log/%s/%s/%s/%020d", enc.EncodeToString([]byte(id.App)), enc.EncodeToString([]byte(id.Type)), enc.EncodeToString([]byte(id.Key)), first)
}

// TestLogCold_LongestNamesFlushAndReadBack: a log whose type and key are 256
// bytes (the spec's longest) trims to cold storage, in memory and on the file
// system, and reads every record back.
func TestLogCold_LongestNamesFlushAndReadBack(t *testing.T) {
	long1, long2 := longName(MaxNameBytes, 'é'), longName(MaxNameBytes, 'ü')
	ids := map[string]ObjectID{
		"type and key":  {App: "app_t", Type: long1, Key: long2},
		"type":          {App: "app_t", Type: long1, Key: "p"},
		"key (192 B)":   {App: "app_t", Type: "events", Key: longName(192, 'ü')},
		"app and names": {App: "app_" + strings.Repeat("a", 60), Type: long2, Key: long1},
	}
	stores := map[string]func(t *testing.T) cold.Store{
		"memory": func(*testing.T) cold.Store { return cold.NewMemory() },
		"fs": func(t *testing.T) cold.Store {
			s, err := coldfs.Open(t.TempDir())
			if err != nil {
				t.Fatal(err)
			}
			return s
		},
	}
	for name, open := range stores {
		for what, id := range ids {
			t.Run(name+"/"+what, func(t *testing.T) { longNamesRoundTrip(t, open(t), id) })
		}
	}
}

func longNamesRoundTrip(t *testing.T, store cold.Store, id ObjectID) {
	if err := ValidateID(id); err != nil {
		t.Fatalf("the test's names: %v", err)
	}
	{
		{
			n := startNode(t, t.TempDir(), nodeOpts{cfg: Config{
				Cold: store, ColdTimeout: 5 * time.Second,
				TypeOptions: func(string) TypeOptions {
					o := DefaultTypeOptions()
					o.Log = LogOptions{MaxBatchSize: 10, MaxRecords: 5, Cold: true}
					return o
				},
			}})
			l := NewLog(n.host, id)
			ctx := context.Background()
			for i := 0; i < 3; i++ {
				appendN(t, l, i*10, 10)
			}
			removed, err := l.Trim(ctx)
			if err != nil || removed != 25 {
				t.Fatalf("trim: %d %v, want 25 records to cold storage", removed, err)
			}
			if b, _ := l.Bounds(ctx); *b != (LogBounds{OldestOffset: 0, HotOffset: 25, NextOffset: 30}) {
				t.Fatalf("bounds %+v", b)
			}
			if pages := readPages(t, l, 0); fmt.Sprint(pages) != fmt.Sprint([][]uint64{
				{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}, {10, 11, 12, 13, 14, 15, 16, 17, 18, 19}, {20, 21, 22, 23, 24}, {25, 26, 27, 28, 29}}) {
				t.Fatalf("pages %v", pages)
			}
			// The object's segments are listed under its own prefix.
			prefix := segmentKey(id, 0)
			prefix = prefix[:strings.LastIndex(prefix, "/")+1]
			if segs, err := store.List(ctx, prefix); err != nil || len(segs) != 3 {
				t.Fatalf("segments under the object's prefix: %v %v", segs, err)
			}
		}
	}
}

// TestLogCold_ShortNamesKeepTheirPath: names whose base64url form fits one path
// segment (up to 191 bytes, the longest that ever worked) keep the path they had
// before issue 26, so that a flush fixed by an older version and retried by this
// one writes (or finds) the same object, and nothing needs migrating.
func TestLogCold_ShortNamesKeepTheirPath(t *testing.T) {
	for _, size := range []int{1, 2, 3, 100, 150, 189, 190, 191} {
		for _, r := range []rune{'k', 'é'} {
			id := ObjectID{App: "app_t", Type: longName(size, r), Key: longName(size, r)}
			if got, want := segmentKey(id, 42), oldSegmentKey(id, 42); got != want {
				t.Fatalf("%d-byte names: key %s, the old layout had %s", size, got, want)
			}
		}
	}
	// And end to end: a flush of a 191-byte name lands on the old path.
	mem := cold.NewMemory()
	n := startNode(t, t.TempDir(), nodeOpts{cfg: Config{
		Cold: mem, ColdTimeout: 5 * time.Second,
		TypeOptions: func(string) TypeOptions {
			o := DefaultTypeOptions()
			o.Log = LogOptions{MaxBatchSize: 10, MaxRecords: 1, Cold: true}
			return o
		},
	}})
	id := ObjectID{App: "app_t", Type: longName(191, 'é'), Key: longName(191, 'k')}
	l := NewLog(n.host, id)
	appendN(t, l, 0, 3)
	if removed, err := l.Trim(context.Background()); err != nil || removed != 2 {
		t.Fatalf("trim: %d %v", removed, err)
	}
	if _, err := mem.Get(context.Background(), oldSegmentKey(id, 0)); err != nil {
		t.Fatalf("the segment is not at the old layout's path: %v", err)
	}
	if pages := readPages(t, l, 0); fmt.Sprint(pages) != "[[0 1] [2]]" {
		t.Fatalf("pages %v", pages)
	}
}
