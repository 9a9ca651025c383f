package durable

import (
	"os"
	"path/filepath"
	"testing"
)

func TestMkdirAll_MakesEveryLevelAndAcceptsWhatExists(t *testing.T) {
	root := t.TempDir()
	p := filepath.Join(root, "a", "b", "c")
	if err := MkdirAll(p, 0o755); err != nil {
		t.Fatal(err)
	}
	if st, err := os.Stat(p); err != nil || !st.IsDir() {
		t.Fatalf("not made: %v", err)
	}
	if err := MkdirAll(p, 0o755); err != nil {
		t.Fatalf("existing path: %v", err)
	}
	file := filepath.Join(root, "f")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := MkdirAll(filepath.Join(file, "x"), 0o755); err == nil {
		t.Fatal("a path under a file was accepted")
	}
}
