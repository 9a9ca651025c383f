package main

import (
	"os"
	"path/filepath"
	"reflect"
	"testing"
	"time"

	"github.com/holdfast/holdfast/actors"
	"github.com/holdfast/holdfast/config"
)

// The queue settings of a type reach the actors' options.
func TestTypeOptions_Queue(t *testing.T) {
	path := filepath.Join(t.TempDir(), "holdfast.yaml")
	yaml := `types:
  jobs:
    queue:
      targets: [email, audit]
      maxAttempts: 7
      visibilityTimeout: 45s
      backoff: {initial: 2s, multiplier: 3, max: 1m}
      maxPending: 500
      completedRetention: 1h
      deadLetterRetention: 48h
      concurrency: 3
`
	if err := os.WriteFile(path, []byte(yaml), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Load(path, func(string) string { return "" })
	if err != nil {
		t.Fatal(err)
	}
	got := typeOptions(cfg.Type("jobs")).Queue
	want := actors.QueueOptions{Targets: []string{"email", "audit"}, MaxAttempts: 7, VisibilityTimeout: 45 * time.Second,
		Backoff: actors.Backoff{Initial: 2 * time.Second, Multiplier: 3, Max: time.Minute}, MaxPending: 500,
		CompletedRetention: time.Hour, DeadLetterRetention: 48 * time.Hour, Concurrency: 3}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("queue options %+v, want %+v", got, want)
	}
	if d := typeOptions(cfg.Type("other")).Queue; !reflect.DeepEqual(d.Targets, []string{"default"}) || d.MaxAttempts != 5 || d.MaxPending != 1_000_000 {
		t.Fatalf("defaults %+v", d)
	}
}

// TestColdShared: a replicated cluster needs a cold store every node reads,
// unless no type flushes logs to it (then the default private directory is
// never read or written).
func TestColdShared(t *testing.T) {
	for _, c := range []struct {
		yaml string
		want bool
	}{
		{"", true},
		{"types: {events: {log: {cold: true}}}\n", false},
		{"cold: {fs: {dir: /mnt/shared, shared: true}}\ntypes: {events: {log: {cold: true}}}\n", true},
		{"cold: {store: s3, s3: {endpoint: '127.0.0.1:9000', bucket: b}}\ntypes: {\"*\": {log: {cold: true}}}\n", true},
		{"cold: {store: none}\n", true},
	} {
		path := filepath.Join(t.TempDir(), "holdfast.yaml")
		if err := os.WriteFile(path, []byte(c.yaml), 0o644); err != nil {
			t.Fatal(err)
		}
		cfg, err := config.Load(path, func(string) string { return "" })
		if err != nil {
			t.Fatalf("%q: %v", c.yaml, err)
		}
		if got := coldShared(cfg); got != c.want {
			t.Errorf("%q: coldShared %v, want %v", c.yaml, got, c.want)
		}
	}
}
