package powerfs

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// mount mounts an FS over a new directory and unmounts it when the test ends
// (a no-op after Cut). It skips the test only where there is no /dev/fuse.
func mount(t *testing.T, seed string) (*FS, string) {
	t.Helper()
	if _, err := os.Stat("/dev/fuse"); errors.Is(err, os.ErrNotExist) {
		t.Skip("no /dev/fuse: powerfs needs FUSE")
	}
	mnt := t.TempDir()
	fs, err := Mount(mnt, Options{Seed: seed})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := fs.Unmount(); err != nil {
			t.Error(err)
		}
	})
	return fs, mnt
}

// cut cuts the power and returns the directory holding the durable state.
func cut(t *testing.T, fs *FS, stop func()) string {
	t.Helper()
	rec := filepath.Join(t.TempDir(), "recovered")
	if err := fs.Cut(stop, rec); err != nil {
		t.Fatal(err)
	}
	return rec
}

func syncPath(t *testing.T, path string) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := f.Sync(); err != nil {
		t.Fatalf("sync %s: %v", path, err)
	}
}

func writeFile(t *testing.T, path, content string, sync bool) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteString(content); err != nil {
		t.Fatal(err)
	}
	if sync {
		if err := f.Sync(); err != nil {
			t.Fatal(err)
		}
	}
}

// wantFile checks the file at path holds want; a nil want means it must not exist.
func wantFile(t *testing.T, path string, want []byte) {
	t.Helper()
	got, err := os.ReadFile(path)
	switch {
	case want == nil && errors.Is(err, os.ErrNotExist):
	case want == nil:
		t.Errorf("%s: should be gone, holds %q (err %v)", path, got, err)
	case err != nil:
		t.Errorf("%s: %v", path, err)
	case !bytes.Equal(got, want):
		t.Errorf("%s: got %q, want %q", path, got, want)
	}
}

func TestFS_UnsyncedDataIsLostSyncedDataKept(t *testing.T) {
	fs, mnt := mount(t, "")
	p := filepath.Join(mnt, "f")
	f, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	syncPath(t, mnt)
	if _, err := f.WriteString("hello"); err != nil {
		t.Fatal(err)
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteString(" world"); err != nil {
		t.Fatal(err)
	}
	// The live view has it all.
	wantFile(t, p, []byte("hello world"))
	rec := cut(t, fs, func() { f.Close() })
	wantFile(t, filepath.Join(rec, "f"), []byte("hello"))
}

func TestFS_OverwriteAfterSyncIsLost(t *testing.T) {
	fs, mnt := mount(t, "")
	p := filepath.Join(mnt, "f")
	big := bytes.Repeat([]byte("a"), 3*chunkSize+100)
	f, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	syncPath(t, mnt)
	if _, err := f.Write(big); err != nil {
		t.Fatal(err)
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	// Overwrites inside chunks the durable state shares, and a growth.
	if _, err := f.WriteAt([]byte("XYZ"), chunkSize+7); err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte("tail"), int64(len(big))); err != nil {
		t.Fatal(err)
	}
	rec := cut(t, fs, func() { f.Close() })
	wantFile(t, filepath.Join(rec, "f"), big)
}

func TestFS_EntryIsLostWithoutDirectorySync(t *testing.T) {
	fs, mnt := mount(t, "")
	writeFile(t, filepath.Join(mnt, "synced-file-unsynced-dir"), "x", true)
	rec := cut(t, fs, nil)
	wantFile(t, filepath.Join(rec, "synced-file-unsynced-dir"), nil)
}

func TestFS_EntryIsKeptWithDirectorySync(t *testing.T) {
	fs, mnt := mount(t, "")
	writeFile(t, filepath.Join(mnt, "kept"), "data", true)
	writeFile(t, filepath.Join(mnt, "empty"), "data not synced", false)
	syncPath(t, mnt)
	rec := cut(t, fs, nil)
	wantFile(t, filepath.Join(rec, "kept"), []byte("data"))
	// The entry is durable, its data was never synced.
	wantFile(t, filepath.Join(rec, "empty"), []byte{})
}

func TestFS_FileNeedsEveryAncestorEntry(t *testing.T) {
	fs, mnt := mount(t, "")
	for _, d := range []string{"a", "b", "b/c"} {
		if err := os.Mkdir(filepath.Join(mnt, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	writeFile(t, filepath.Join(mnt, "a/f"), "in a", true)
	syncPath(t, filepath.Join(mnt, "a")) // a's entry in the root never synced
	writeFile(t, filepath.Join(mnt, "b/c/f"), "in c", true)
	syncPath(t, filepath.Join(mnt, "b/c"))
	syncPath(t, filepath.Join(mnt, "b"))
	rec := cut(t, fs, nil)
	if _, err := os.Stat(filepath.Join(rec, "a")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a: want gone (its entry in the root was never synced), got %v", err)
	}
	if _, err := os.Stat(filepath.Join(rec, "b")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("b: want gone (its entry in the root was never synced), got %v", err)
	}

	// Now with the root synced too.
	fs2, mnt2 := mount(t, "")
	if err := os.MkdirAll(filepath.Join(mnt2, "b/c"), 0o755); err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(mnt2, "b/c/f"), "in c", true)
	syncPath(t, filepath.Join(mnt2, "b/c"))
	syncPath(t, filepath.Join(mnt2, "b"))
	syncPath(t, mnt2)
	rec2 := cut(t, fs2, nil)
	wantFile(t, filepath.Join(rec2, "b/c/f"), []byte("in c"))
}

func TestFS_RenameIsRevertedWithoutDirectorySync(t *testing.T) {
	fs, mnt := mount(t, "")
	if err := os.Mkdir(filepath.Join(mnt, "d"), 0o755); err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(mnt, "old"), "1", true)
	writeFile(t, filepath.Join(mnt, "moved"), "2", true)
	writeFile(t, filepath.Join(mnt, "gone"), "3", true)
	syncPath(t, mnt)
	if err := os.Rename(filepath.Join(mnt, "old"), filepath.Join(mnt, "new")); err != nil {
		t.Fatal(err)
	}
	// Into d, and d synced, but not the root: the file is in both places.
	if err := os.Rename(filepath.Join(mnt, "moved"), filepath.Join(mnt, "d/moved")); err != nil {
		t.Fatal(err)
	}
	syncPath(t, filepath.Join(mnt, "d"))
	if err := os.Remove(filepath.Join(mnt, "gone")); err != nil {
		t.Fatal(err)
	}
	wantFile(t, filepath.Join(mnt, "new"), []byte("1"))
	wantFile(t, filepath.Join(mnt, "old"), nil)
	rec := cut(t, fs, nil)
	wantFile(t, filepath.Join(rec, "old"), []byte("1"))
	wantFile(t, filepath.Join(rec, "new"), nil)
	wantFile(t, filepath.Join(rec, "moved"), []byte("2"))
	wantFile(t, filepath.Join(rec, "d/moved"), []byte("2"))
	wantFile(t, filepath.Join(rec, "gone"), []byte("3"))
}

func TestFS_RenameIsKeptWithDirectorySync(t *testing.T) {
	fs, mnt := mount(t, "")
	writeFile(t, filepath.Join(mnt, "old"), "1", true)
	writeFile(t, filepath.Join(mnt, "target"), "overwritten", true)
	syncPath(t, mnt)
	if err := os.Rename(filepath.Join(mnt, "old"), filepath.Join(mnt, "target")); err != nil {
		t.Fatal(err)
	}
	syncPath(t, mnt)
	rec := cut(t, fs, nil)
	wantFile(t, filepath.Join(rec, "old"), nil)
	wantFile(t, filepath.Join(rec, "target"), []byte("1"))
}

// The mapping is written by a child process: touching a mapped page of a FUSE
// file faults into the kernel, which waits for this process's FUSE server;
// if the Go runtime stops the world meanwhile (a GC), the faulting thread
// cannot be stopped and the server goroutine cannot run, and the test hangs
// for good (seen in CI: "stopping the world, 10 minutes", a thread left in
// request_wait_answer). Holdfast's own power-cut test runs its storage in a
// child for the same reason.
func TestFS_MmapWriteIsDurableAfterMsync(t *testing.T) {
	fs, mnt := mount(t, "")
	p := filepath.Join(mnt, "m")
	f, err := os.OpenFile(p, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(mmapSize); err != nil {
		t.Fatal(err)
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	f.Close()
	syncPath(t, mnt)
	cmd := exec.Command(os.Args[0], "-test.run=^TestFS_MmapChild$")
	cmd.Env = append(os.Environ(), "POWERFS_MMAP_FILE="+p)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("the child that writes through the mapping: %v\n%s", err, out)
	}
	want := make([]byte, mmapSize)
	copy(want[100:], "through the mapping")
	copy(want[chunkSize+5:], "second chunk")
	rec := cut(t, fs, func() {})
	wantFile(t, filepath.Join(rec, "m"), want)
}

const mmapSize = 2*chunkSize + 4096

// TestFS_MmapChild is TestFS_MmapWriteIsDurableAfterMsync's child: it maps
// the file, writes two chunks through the mapping and msyncs them. It does
// nothing when run as a test.
func TestFS_MmapChild(t *testing.T) {
	p := os.Getenv("POWERFS_MMAP_FILE")
	if p == "" {
		t.Skip("the child of TestFS_MmapWriteIsDurableAfterMsync")
	}
	f, err := os.OpenFile(p, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	m, err := unix.Mmap(int(f.Fd()), 0, mmapSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	copy(m[100:], "through the mapping")
	copy(m[chunkSize+5:], "second chunk")
	if err := unix.Msync(m, unix.MS_SYNC); err != nil {
		t.Fatal(err)
	}
	if err := unix.Munmap(m); err != nil {
		t.Fatal(err)
	}
}

func TestFS_Truncate(t *testing.T) {
	fs, mnt := mount(t, "")
	p := filepath.Join(mnt, "t")
	f, err := os.OpenFile(p, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	syncPath(t, mnt)
	if _, err := f.Write(bytes.Repeat([]byte("x"), chunkSize+10)); err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(10); err != nil {
		t.Fatal(err)
	}
	// Grown again: the bytes past the cut read as zeros.
	if err := f.Truncate(20); err != nil {
		t.Fatal(err)
	}
	want := append(bytes.Repeat([]byte("x"), 10), make([]byte, 10)...)
	wantFile(t, p, want)
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	// Unsynced: a shrink to 5 is lost.
	if err := f.Truncate(5); err != nil {
		t.Fatal(err)
	}
	rec := cut(t, fs, func() { f.Close() })
	wantFile(t, filepath.Join(rec, "t"), want)
}

func TestFS_RemovedDirectoryComesBackWithoutParentSync(t *testing.T) {
	fs, mnt := mount(t, "")
	if err := os.Mkdir(filepath.Join(mnt, "d"), 0o755); err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(mnt, "d/f"), "f", true)
	syncPath(t, filepath.Join(mnt, "d"))
	syncPath(t, mnt)
	if err := os.Remove(filepath.Join(mnt, "d/f")); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(mnt, "d")); err != nil {
		t.Fatal(err)
	}
	rec := cut(t, fs, nil)
	wantFile(t, filepath.Join(rec, "d/f"), []byte("f"))
}

func TestFS_OperationsFailAfterCut(t *testing.T) {
	fs, mnt := mount(t, "")
	f, err := os.Create(filepath.Join(mnt, "f"))
	if err != nil {
		t.Fatal(err)
	}
	var writeErr, syncErr, createErr error
	cut(t, fs, func() {
		_, writeErr = f.WriteString("after the cut")
		syncErr = f.Sync()
		_, createErr = os.Create(filepath.Join(mnt, "g"))
		f.Close()
	})
	for what, err := range map[string]error{"write": writeErr, "fsync": syncErr, "create": createErr} {
		if !errors.Is(err, syscall.EIO) {
			t.Errorf("%s after the cut: got %v, want EIO", what, err)
		}
	}
}

func TestFS_SeedIsDurable(t *testing.T) {
	seed := t.TempDir()
	if err := os.MkdirAll(filepath.Join(seed, "a/b"), 0o755); err != nil {
		t.Fatal(err)
	}
	content := append(bytes.Repeat([]byte{0}, 2*chunkSize), []byte("end")...)
	if err := os.WriteFile(filepath.Join(seed, "a/b/f"), content, 0o644); err != nil {
		t.Fatal(err)
	}
	fs, mnt := mount(t, seed)
	wantFile(t, filepath.Join(mnt, "a/b/f"), content)
	ents, err := os.ReadDir(filepath.Join(mnt, "a"))
	if err != nil || len(ents) != 1 || ents[0].Name() != "b" || !ents[0].IsDir() {
		t.Fatalf("readdir a: %v, %v", ents, err)
	}
	// Unsynced changes to it are lost.
	if err := os.Remove(filepath.Join(mnt, "a/b/f")); err != nil {
		t.Fatal(err)
	}
	rec := cut(t, fs, nil)
	wantFile(t, filepath.Join(rec, "a/b/f"), content)
}

func TestFS_DirectOpenIsRefused(t *testing.T) {
	_, mnt := mount(t, "")
	writeFile(t, filepath.Join(mnt, "f"), "x", false)
	_, err := os.OpenFile(filepath.Join(mnt, "f"), os.O_RDWR|syscall.O_DIRECT, 0)
	if !errors.Is(err, syscall.EINVAL) {
		t.Fatalf("O_DIRECT open: got %v, want EINVAL", err)
	}
}
