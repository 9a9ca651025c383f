package actors

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/holdfast/holdfast/persistence"
)

// A log whose appends are large (a block of 1 MiB or more, which Badger keeps
// in its value log) gives the disk space of trimmed records back: trimming
// does not only hide them.
func TestLog_TrimmedLargeAppendsGiveTheirDiskSpaceBack(t *testing.T) {
	if testing.Short() {
		t.Skip("appends 60 MiB")
	}
	opts := func(string) TypeOptions {
		o := DefaultTypeOptions()
		o.Log = LogOptions{MaxBatchSize: 100, MaxRecords: 3}
		return o
	}
	dir := t.TempDir()
	n := startNode(t, dir, nodeOpts{
		db:   persistence.Config{ValueLogFileSize: 4 << 20},
		pipe: persistence.PipelineConfig{ValueLogGCEvery: 20 * time.Millisecond},
		cfg:  Config{TypeOptions: opts},
	})
	ctx := context.Background()
	l := NewLog(n.host, ObjectID{App: "app_t", Type: "events", Key: "big"})
	body := func(i int) []byte { // 512 KiB of JSON
		return fmt.Appendf(nil, `"%d-%s"`, i, strings.Repeat("x", 512<<10))
	}
	const appends = 40 // of 3 records: 60 MiB, in 4 MiB value-log files
	for a := range appends {
		in := make([]LogInput, 3)
		for i := range in {
			in[i].Body = body(3*a + i)
		}
		if _, err := l.Append(ctx, in...); err != nil {
			t.Fatal(err)
		}
		if _, err := l.Trim(ctx); err != nil {
			t.Fatal(err)
		}
	}
	files := func() int {
		m, err := filepath.Glob(filepath.Join(dir, "badger", "*.vlog"))
		if err != nil {
			t.Fatal(err)
		}
		return len(m)
	}
	const most = 6                           // the hot records' file, the current one, garbage not yet found
	n.pipe.WaitApplied(context.Background()) // every block is in Badger's files: the count below starts high
	deadline := time.Now().Add(30 * time.Second)
	for files() > most {
		if time.Now().After(deadline) {
			t.Fatalf("%d value-log files hold a log of 3 hot records of 512 KiB; want at most %d", files(), most)
		}
		time.Sleep(20 * time.Millisecond)
	}
	page, err := l.Read(ctx, 3*appends-3, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(page.Records) != 3 {
		t.Fatalf("read %d hot records, want 3", len(page.Records))
	}
	for i, r := range page.Records {
		if want := body(3*appends - 3 + i); string(r.Body) != string(want) {
			t.Errorf("record %d: %d bytes starting %.12s, want %d bytes starting %.12s", r.Offset, len(r.Body), r.Body, len(want), want)
		}
	}
}
