package main

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"testing"
	"time"
)

// JSON logs write a duration as Go does ("1.5s"), in groups too; the text
// format is unchanged.
func TestNewLogger_DurationsAreReadable(t *testing.T) {
	var b bytes.Buffer
	log, err := newLogger(&b, "json", "info")
	if err != nil {
		t.Fatal(err)
	}
	log.Info("took", "took", 1500*time.Millisecond, slog.Group("g", "wait", 2*time.Second), "n", 3)
	var line struct {
		Took string
		G    struct{ Wait string }
		N    int
	}
	if err := json.Unmarshal(b.Bytes(), &line); err != nil {
		t.Fatalf("%v: %s", err, b.Bytes())
	}
	if line.Took != "1.5s" || line.G.Wait != "2s" || line.N != 3 {
		t.Fatalf("logged %s", b.Bytes())
	}
	b.Reset()
	log, _ = newLogger(&b, "text", "info")
	log.Info("took", "took", 1500*time.Millisecond)
	if !bytes.Contains(b.Bytes(), []byte("took=1.5s")) {
		t.Fatalf("text logged %s", b.Bytes())
	}
}
