package main

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/holdfast/holdfast/actors"
	"github.com/holdfast/holdfast/config"
)

// The alarm settings of a type reach the actors' options.
func TestTypeOptions_Alarms(t *testing.T) {
	path := filepath.Join(t.TempDir(), "holdfast.yaml")
	if err := os.WriteFile(path, []byte("types:\n  capped:\n    alarms: {maxAttempts: 3, maxPerObject: 50}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Load(path, func(string) string { return "" })
	if err != nil {
		t.Fatal(err)
	}
	if got, want := typeOptions(cfg.Type("capped")).Alarms, (actors.AlarmOptions{MaxAttempts: 3, MaxPerObject: 50}); got != want {
		t.Fatalf("alarm options %+v, want %+v", got, want)
	}
	if got := typeOptions(cfg.Type("other")).Alarms.MaxPerObject; got != actors.DefaultMaxAlarms {
		t.Fatalf("default maxPerObject %d, want %d", got, actors.DefaultMaxAlarms)
	}
}
