package holdfast_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/holdfast/holdfast"
	"github.com/holdfast/holdfast/actors"
	"github.com/holdfast/holdfast/cold"
	coldfs "github.com/holdfast/holdfast/cold/fs"
	"github.com/holdfast/holdfast/internal/s3test"
)

// TestCold_LongestNames (issue 26, point 4): a log whose type and key are 256
// bytes, the spec's longest names, has its retention trim records to cold
// storage (cold/fs, and a MinIO process behind a bucket prefix) and reads every
// record back. Before, such a flush failed (`file name too long`, or a key past
// the store's limit) and the records stayed hot for ever.
func TestCold_LongestNames(t *testing.T) {
	typ, key := strings.Repeat("é", 128), strings.Repeat("界", 85)+"x"
	if len(typ) != 256 || len(key) != 256 {
		t.Fatalf("names of %d and %d bytes", len(typ), len(key))
	}
	stores := map[string]func(t *testing.T) cold.Store{
		"fs": func(t *testing.T) cold.Store {
			s, err := coldfs.Open(t.TempDir())
			if err != nil {
				t.Fatal(err)
			}
			return s
		},
		"minio": func(t *testing.T) cold.Store {
			_, store := openWithMinIO(t, s3test.MinIO(t), 5*time.Second)
			return store
		},
	}
	for name, open := range stores {
		t.Run(name, func(t *testing.T) {
			store := open(t)
			rt, err := holdfast.Open(holdfast.Options{
				DataDir: t.TempDir(), Cold: store,
				TypeOptions: func(string) holdfast.TypeOptions {
					o := actors.DefaultTypeOptions()
					o.Log = holdfast.LogOptions{MaxBatchSize: 10, MaxRecords: 5, Cold: true}
					return o
				},
			})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = rt.Close(context.Background()) })
			ctx := context.Background()
			l := rt.Log("app_t", typ, key)
			appendBodies(t, l, 0, 35)
			removed, err := l.Trim(ctx)
			if err != nil || removed != 30 {
				t.Fatalf("trim: %d %v, want 30 records to cold storage", removed, err)
			}
			if b, err := l.Bounds(ctx); err != nil || b.OldestOffset != 0 || b.HotOffset != 30 {
				t.Fatalf("bounds %+v %v", b, err)
			}
			readAllOnce(t, l, 35)
			segs, err := store.List(ctx, cold.LogObjectPrefix("app_t", typ, key))
			if err != nil || len(segs) != 3 {
				t.Fatalf("the log's segments: %v %v", segs, err)
			}
		})
	}
}
