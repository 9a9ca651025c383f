package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"time"

	"github.com/holdfast/holdfast"
	"github.com/holdfast/holdfast/cold"
	coldfs "github.com/holdfast/holdfast/cold/fs"
	colds3 "github.com/holdfast/holdfast/cold/s3"
	"github.com/holdfast/holdfast/internal/s3test"
)

// The cold benchmark: flush throughput (records per second moved to the cold
// store by trims) to cold/fs and to a MinIO server process, and a sequential
// read of a log whose records are all cold against the same log read hot.

// benchTB lets the bench start test servers (internal/s3test) outside a test.
type benchTB struct {
	dir      string
	cleanups []func()
}

func (b *benchTB) Helper()                           {}
func (b *benchTB) Fatalf(format string, args ...any) { fatal(fmt.Errorf(format, args...)) }
func (b *benchTB) Skipf(format string, args ...any)  { fatal(fmt.Errorf(format, args...)) }
func (b *benchTB) TempDir() string {
	d, err := os.MkdirTemp(b.dir, "srv-")
	if err != nil {
		fatal(err)
	}
	return d
}
func (b *benchTB) Cleanup(f func()) { b.cleanups = append(b.cleanups, f) }
func (b *benchTB) close() {
	for i := len(b.cleanups) - 1; i >= 0; i-- {
		b.cleanups[i]()
	}
}

type coldResult struct {
	store             string
	flushRecordsPerS  float64
	coldReadRecordsPS float64
	hotReadRecordsPS  float64
}

func runCold(base string, records, rounds int) int {
	tb := &benchTB{dir: base}
	defer tb.close()
	srv := s3test.MinIO(tb)
	stores := []struct {
		name string
		open func(dir string) (cold.Store, error)
	}{
		{"cold/fs", func(dir string) (cold.Store, error) { return coldfs.Open(filepath.Join(dir, "cold")) }},
		{"MinIO (cold/s3)", func(dir string) (cold.Store, error) {
			return colds3.Open(context.Background(), colds3.Config{
				Endpoint: srv.Endpoint, Bucket: "bench", AccessKey: s3test.AccessKey, SecretKey: s3test.SecretKey,
				Prefix: filepath.Base(dir) + "/", CreateBucket: true, Timeout: 30 * time.Second,
			})
		}},
	}
	results := map[string][]coldResult{}
	for r := 0; r < rounds; r++ {
		for _, s := range stores {
			dir, err := os.MkdirTemp(base, "cold-")
			if err != nil {
				fatal(err)
			}
			store, err := s.open(dir)
			if err != nil {
				fatal(err)
			}
			res, err := coldOnce(dir, store, records)
			if err != nil {
				fatal(fmt.Errorf("%s: %w", s.name, err))
			}
			res.store = s.name
			fmt.Fprintf(os.Stderr, "round %d %s: flush %.0f records/s, cold read %.0f records/s, hot read %.0f records/s\n",
				r+1, s.name, res.flushRecordsPerS, res.coldReadRecordsPS, res.hotReadRecordsPS)
			results[s.name] = append(results[s.name], res)
			os.RemoveAll(dir)
		}
	}
	med := func(rs []coldResult, f func(coldResult) float64) float64 {
		v := make([]float64, len(rs))
		for i, r := range rs {
			v[i] = f(r)
		}
		sort.Float64s(v)
		return v[len(v)/2]
	}
	fmt.Printf("| cold store, one log of %d records (256-byte bodies), median of %d | flush (records/s) | sequential read cold (records/s) | the same log read hot (records/s) | cold / hot |\n|---|---|---|---|---|\n", records, rounds)
	for _, s := range stores {
		rs := results[s.name]
		c, h := med(rs, func(r coldResult) float64 { return r.coldReadRecordsPS }), med(rs, func(r coldResult) float64 { return r.hotReadRecordsPS })
		fmt.Printf("| %s | %.0f | %.0f | %.0f | %.2f |\n", s.name, med(rs, func(r coldResult) float64 { return r.flushRecordsPerS }), c, h, c/h)
	}
	return 0
}

// coldOnce fills a log (segments of 1,000 records), reads it hot, flushes all of
// it but one record, and reads it again from the cold store.
func coldOnce(dir string, store cold.Store, records int) (coldResult, error) {
	open := func(maxRecords int64) (*holdfast.Runtime, error) {
		return holdfast.Open(holdfast.Options{DataDir: filepath.Join(dir, "db"), Logger: quietLogger(), TuneGOMAXPROCS: true, Cold: store,
			TypeOptions: func(string) holdfast.TypeOptions {
				o := defaultTypeOptions()
				o.Log = holdfast.LogOptions{MaxBatchSize: 1000, MaxRecords: maxRecords, Cold: true}
				return o
			}})
	}
	rt, err := open(0) // no retention while filling
	if err != nil {
		return coldResult{}, err
	}
	ctx := context.Background()
	l := rt.Log("app_bench", "stream", "cold")
	in := make([]holdfast.LogInput, 1000)
	for i := range in {
		in[i].Body = recordBody
	}
	for n := 0; n < records; n += len(in) {
		if _, err := l.Append(ctx, in...); err != nil {
			return coldResult{}, err
		}
	}
	scan := func() (float64, error) {
		start := time.Now()
		var from uint64
		got := 0
		for {
			p, err := l.Read(ctx, from, 1000)
			if err != nil {
				return 0, err
			}
			if len(p.Records) == 0 {
				break
			}
			got += len(p.Records)
			from = p.NextOffset
		}
		if got != records {
			return 0, fmt.Errorf("read %d records of %d", got, records)
		}
		return float64(got) / time.Since(start).Seconds(), nil
	}
	hot, err := scan()
	if err != nil {
		return coldResult{}, err
	}
	// Flush everything: the same data reopened with a retention of 1 record.
	if err := rt.Close(ctx); err != nil {
		return coldResult{}, err
	}
	if rt, err = open(1); err != nil {
		return coldResult{}, err
	}
	defer rt.Close(context.Background())
	l = rt.Log("app_bench", "stream", "cold")
	start := time.Now()
	removed, err := l.Trim(ctx)
	if err != nil {
		return coldResult{}, err
	}
	flush := float64(removed) / time.Since(start).Seconds()
	coldRead, err := scan()
	if err != nil {
		return coldResult{}, err
	}
	return coldResult{flushRecordsPerS: flush, coldReadRecordsPS: coldRead, hotReadRecordsPS: hot}, nil
}
