package bx

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/holdfast/holdfast/persistence"
)

func TestPipelineSerial(t *testing.T) {
	for r := 0; r < 3; r++ {
		db, err := persistence.Open(persistence.Config{Dir: t.TempDir()})
		if err != nil { t.Fatal(err) }
		p := persistence.NewPipeline(db, persistence.PipelineConfig{})
		p.Start()
		val := make([]byte, 200)
		n := 0
		start := time.Now()
		for time.Since(start) < time.Second {
			w := &persistence.Write{Sets: []persistence.KV{{Key: []byte(fmt.Sprint("k", n%100)), Value: val}, {Key: []byte(fmt.Sprint("log", n)), Value: val}}}
			if err := p.Submit(w).Wait(context.Background()); err != nil { t.Fatal(err) }
			n++
		}
		t.Logf("pipeline serial %.0f/s", float64(n)/time.Since(start).Seconds())
		p.Close(); db.Close()
	}
}
