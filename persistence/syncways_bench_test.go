package persistence

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// BenchmarkSyncWays compares ways of making one 4 KiB overwrite durable, in a
// pre-written file, one after another: the fsync probe's way (a write through
// the page cache, then fdatasync), an O_DIRECT write then fdatasync, and the log's
// way (pwritev2 with RWF_DSYNC through O_DIRECT). Run it with -count to interleave:
//
//	go test ./persistence -run XXX -bench SyncWays -count 5 -benchtime 1s
func BenchmarkSyncWays(b *testing.B) {
	path := filepath.Join(b.TempDir(), "sync")
	const size = 64 << 20
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	chunk := make([]byte, 1<<20)
	for off := int64(0); off < size; off += int64(len(chunk)) {
		if _, err := f.WriteAt(chunk, off); err != nil {
			b.Fatal(err)
		}
	}
	if err := fdatasync(f); err != nil {
		b.Fatal(err)
	}
	direct, err := os.OpenFile(path, os.O_RDWR|syscall.O_DIRECT, 0)
	if err != nil {
		b.Skipf("no O_DIRECT here: %v", err)
	}
	defer direct.Close()
	pw := &pageWriter{}
	pw.grow(pageSize) // page-aligned memory
	page := pw.buf[:pageSize]
	ways := []struct {
		name  string
		write func(off int64) error
	}{
		{"page-cache-then-fdatasync", func(off int64) error {
			if _, err := f.WriteAt(page, off); err != nil {
				return err
			}
			return fdatasync(f)
		}},
		{"direct-then-fdatasync", func(off int64) error {
			if _, err := direct.WriteAt(page, off); err != nil {
				return err
			}
			return fdatasync(direct)
		}},
		{"direct-RWF_DSYNC", func(off int64) error {
			_, err := unix.Pwritev2(int(direct.Fd()), [][]byte{page}, off, unix.RWF_DSYNC)
			return err
		}},
	}
	for _, w := range ways {
		b.Run(w.name, func(b *testing.B) {
			for i := 0; i < b.N; i++ {
				if err := w.write(int64(i%(size/pageSize)) * pageSize); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
