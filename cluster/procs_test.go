package cluster

import (
	"runtime"
	"testing"
)

func TestTuneGOMAXPROCS(t *testing.T) {
	before := runtime.GOMAXPROCS(0)
	defer runtime.GOMAXPROCS(before)
	t.Setenv("GOMAXPROCS", "")
	if got := TuneGOMAXPROCS(nil); got != before+ExtraProcs || runtime.GOMAXPROCS(0) != got {
		t.Fatalf("GOMAXPROCS %d -> %d, want %d", before, got, before+ExtraProcs)
	}
	runtime.GOMAXPROCS(before)
	t.Setenv("GOMAXPROCS", "1")
	if got := TuneGOMAXPROCS(nil); got != before || runtime.GOMAXPROCS(0) != before {
		t.Fatalf("with GOMAXPROCS set, tuned to %d", got)
	}
}
