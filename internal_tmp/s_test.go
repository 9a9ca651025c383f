package bx

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

func rate(d time.Duration, f func(i int)) float64 {
	n := 0
	start := time.Now()
	for time.Since(start) < d {
		f(n)
		n++
	}
	return float64(n) / time.Since(start).Seconds()
}

func TestSyncPatterns(t *testing.T) {
	dir := t.TempDir()
	mk := func(name string, size int) *os.File {
		f, _ := os.Create(filepath.Join(dir, name))
		z := make([]byte, 1<<20)
		for i := 0; i < size>>20; i++ { f.Write(z) }
		f.Sync()
		return f
	}
	a := mk("a", 1<<20)
	b := mk("b", 64<<20)
	buf := make([]byte, 4096)
	rec := make([]byte, 400)
	for r := 0; r < 3; r++ {
		p := rate(time.Second, func(i int) { a.WriteAt(buf, 0); syscall.Fdatasync(int(a.Fd())) })
		off := int64(0)
		s := rate(time.Second, func(i int) { b.WriteAt(rec, off); off += 400; syscall.Fdatasync(int(b.Fd())) })
		off2 := int64(32<<20)
		s4 := rate(time.Second, func(i int) { b.WriteAt(buf, off2); off2 += 4096; syscall.Fdatasync(int(b.Fd())) })
		t.Logf("probe %.0f  seq400 %.0f (%.2f)  seq4k %.0f (%.2f)", p, s, s/p, s4, s4/p)
	}
}
