package holdfast_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/holdfast/holdfast"
	"github.com/holdfast/holdfast/actors"
	colds3 "github.com/holdfast/holdfast/cold/s3"
	"github.com/holdfast/holdfast/internal/s3test"
)

// Logs with cold storage on a real MinIO server process.

func openWithMinIO(t *testing.T, srv *s3test.Server, timeout time.Duration) (*holdfast.Runtime, *colds3.Store) {
	t.Helper()
	store, err := colds3.Open(context.Background(), colds3.Config{
		Endpoint: srv.Endpoint, Bucket: "holdfast", AccessKey: s3test.AccessKey, SecretKey: s3test.SecretKey,
		Prefix: "segments/", Timeout: timeout, CreateBucket: true,
	})
	if err != nil {
		t.Fatal(err)
	}
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
	return rt, store
}

func appendBodies(t *testing.T, l *holdfast.Log, from, n int) {
	t.Helper()
	for n > 0 {
		k := min(n, 10)
		in := make([]holdfast.LogInput, k)
		for i := range in {
			in[i].Body = []byte(fmt.Sprintf(`{"n":%d}`, from+i))
		}
		if _, err := l.Append(context.Background(), in...); err != nil {
			t.Fatal(err)
		}
		from, n = from+k, n-k
	}
}

// readAllOnce reads the whole log and checks that offsets run from 0 to next
// with the bodies appendBodies wrote.
func readAllOnce(t *testing.T, l *holdfast.Log, next uint64) {
	t.Helper()
	var from uint64
	for from < next {
		p, err := l.Read(context.Background(), from, 0)
		if err != nil {
			t.Fatalf("read from %d: %v", from, err)
		}
		for _, r := range p.Records {
			if r.Offset != from || string(r.Body) != fmt.Sprintf(`{"n":%d}`, from) {
				t.Fatalf("record %d at %d: %s", r.Offset, from, r.Body)
			}
			from++
		}
	}
}

// segmentsOnce lists the object's segments and checks that they tile [0, hot)
// without a gap or an overlap.
func segmentsOnce(t *testing.T, store *colds3.Store, hot uint64) int {
	t.Helper()
	infos, err := store.List(context.Background(), "log/")
	if err != nil {
		t.Fatal(err)
	}
	var firsts []string
	for _, i := range infos {
		firsts = append(firsts, i.Key[strings.LastIndex(i.Key, "/")+1:])
	}
	// Segments are at most 10 records: the first offsets must be increasing and
	// the records they hold were checked by readAllOnce; here: no two segments
	// start at the same offset, and there is one from 0.
	if len(infos) == 0 || !strings.HasSuffix(infos[0].Key, "/00000000000000000000") {
		t.Fatalf("segments %v: none starts at 0", firsts)
	}
	return len(infos)
}

func TestColdMinIO_FlushAndReadBack(t *testing.T) {
	srv := s3test.MinIO(t)
	rt, store := openWithMinIO(t, srv, 3*time.Second)
	l := rt.Log("app_t", "events", "p")
	appendBodies(t, l, 0, 45)
	removed, err := l.Trim(context.Background())
	if err != nil || removed != 40 {
		t.Fatalf("trim: %d %v", removed, err)
	}
	readAllOnce(t, l, 45)
	if n := segmentsOnce(t, store, 40); n != 4 {
		t.Fatalf("%d segments, want 4 of 10", n)
	}
	// With the server gone a cold read is 503 (unavailable), not 410; hot reads go on.
	srv.Kill()
	if _, err := l.Read(context.Background(), 5, 0); !errors.Is(err, actors.ErrUnavailable) || errors.Is(err, holdfast.ErrLogTruncated) {
		t.Fatalf("cold read with MinIO down: %v, want 503", err)
	}
	if p, err := l.Read(context.Background(), 40, 0); err != nil || len(p.Records) != 5 {
		t.Fatalf("hot read with MinIO down: %v", err)
	}
}

// TestColdMinIO_KilledDuringATrim: MinIO is frozen while a flush writes, then
// killed: the trim fails, every record stays hot and readable; after MinIO
// restarts the next trim succeeds, with each record in exactly one segment.
func TestColdMinIO_KilledDuringATrim(t *testing.T) {
	srv := s3test.MinIO(t)
	rt, store := openWithMinIO(t, srv, 3*time.Second)
	ctx := context.Background()
	l := rt.Log("app_t", "events", "p")
	appendBodies(t, l, 0, 25)
	srv.Stop()
	done := make(chan error, 1)
	go func() { _, err := l.Trim(ctx); done <- err }()
	time.Sleep(500 * time.Millisecond) // the flush is waiting on the frozen server
	srv.Kill()
	if err := <-done; !errors.Is(err, actors.ErrUnavailable) {
		t.Fatalf("trim with MinIO killed: %v, want 503", err)
	}
	if b, _ := l.Bounds(ctx); b.HotOffset != 0 {
		t.Fatalf("bounds after the failed trim %+v: records must stay hot", b)
	}
	readAllOnce(t, l, 25)
	srv.Start() // same data directory
	removed, err := l.Trim(ctx)
	if err != nil || removed != 20 {
		t.Fatalf("trim after MinIO restarted: %d %v", removed, err)
	}
	readAllOnce(t, l, 25)
	if n := segmentsOnce(t, store, 20); n != 2 {
		t.Fatalf("%d segments, want 2", n)
	}
}

// TestColdMinIO_FrozenServerFailsTheTrimInTime: with MinIO stopped (SIGSTOP) a
// trim fails within the configured deadline, and the object keeps answering
// appends and reads meanwhile.
func TestColdMinIO_FrozenServerFailsTheTrimInTime(t *testing.T) {
	srv := s3test.MinIO(t)
	rt, _ := openWithMinIO(t, srv, 2*time.Second)
	ctx := context.Background()
	l := rt.Log("app_t", "events", "p")
	appendBodies(t, l, 0, 15)
	srv.Stop()
	defer srv.Cont()
	start := time.Now()
	var wg sync.WaitGroup
	wg.Add(1)
	var trimErr error
	var took time.Duration
	go func() {
		defer wg.Done()
		_, trimErr = l.Trim(ctx)
		took = time.Since(start)
	}()
	time.Sleep(100 * time.Millisecond)
	for i := 0; i < 5; i++ { // the object answers while its flush hangs
		rctx, cancel := context.WithTimeout(ctx, time.Second)
		if _, err := l.Append(rctx, holdfast.LogInput{Body: []byte(fmt.Sprintf(`{"n":%d}`, 15+i))}); err != nil {
			t.Fatalf("append during a hung flush: %v", err)
		}
		if p, err := l.Read(rctx, 0, 1); err != nil || len(p.Records) != 1 {
			t.Fatalf("read during a hung flush: %v", err)
		}
		cancel()
	}
	wg.Wait()
	if !errors.Is(trimErr, actors.ErrUnavailable) || took > 6*time.Second {
		t.Fatalf("trim against a frozen server: %v after %v; the store timeout is 2s", trimErr, took)
	}
	srv.Cont()
	if removed, err := l.Trim(ctx); err != nil || removed != 15 {
		t.Fatalf("trim after the server resumed: %d %v", removed, err)
	}
	readAllOnce(t, l, 20)
}
