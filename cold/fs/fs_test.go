package fs

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/holdfast/holdfast/cold/coldtest"
)

func TestFSConformance(t *testing.T) {
	s, err := Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	coldtest.Run(t, s, "")
}

// TestFSLeavesNoTemporaryFiles: a create leaves only its key behind, and a
// restart removes the temporary files of a crashed create.
func TestFSLeavesNoTemporaryFiles(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Create(context.Background(), "log/a/1", []byte("x")); err != nil {
		t.Fatal(err)
	}
	left, _ := os.ReadDir(filepath.Join(dir, tmpDir))
	if len(left) != 0 {
		t.Fatalf("temporary files left: %v", left)
	}
	if err := os.WriteFile(filepath.Join(dir, tmpDir, "crashed"), []byte("half"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Open(dir); err != nil {
		t.Fatal(err)
	}
	if left, _ := os.ReadDir(filepath.Join(dir, tmpDir)); len(left) != 0 {
		t.Fatalf("temporary files after a reopen: %v", left)
	}
	if l, _ := s.List(context.Background(), ""); len(l) != 1 || l[0].Key != "log/a/1" {
		t.Fatalf("list %v", l)
	}
}
