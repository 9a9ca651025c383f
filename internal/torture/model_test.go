package torture

import (
	"strings"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
)

func set(client int, call, ret int64, value string, logID uint64) porcupine.Operation {
	return porcupine.Operation{ClientId: client, Call: call, Return: ret, Input: kvInput{Op: "set", Value: value}, Output: kvOutput{LogID: logID}}
}

func incr(client int, call, ret int64, by, n int64, logID uint64) porcupine.Operation {
	return porcupine.Operation{ClientId: client, Call: call, Return: ret, Input: kvInput{Op: "incr", By: by}, Output: kvOutput{LogID: logID, N: n}}
}

func get(client int, call, ret int64, a string, n int64, logID uint64) porcupine.Operation {
	return porcupine.Operation{ClientId: client, Call: call, Return: ret, Input: kvInput{Op: "get"},
		Output: kvOutput{LogID: logID, A: a, HasA: a != "", N: n}}
}

func unknownOp(op porcupine.Operation, ret int64) porcupine.Operation {
	op.Output, op.Return = kvOutput{Unknown: true}, ret
	return op
}

func TestModel_Verdicts(t *testing.T) {
	for _, c := range []struct {
		name  string
		ops   []porcupine.Operation
		legal bool
	}{
		{"sequential", []porcupine.Operation{set(0, 0, 1, "x", 1), incr(1, 2, 3, 2, 2, 2), get(0, 4, 5, "x", 2, 2)}, true},
		{"concurrent writes ordered by log_id", []porcupine.Operation{set(0, 0, 10, "x", 2), set(1, 1, 9, "y", 1), get(2, 11, 12, "x", 0, 2)}, true},
		// A write cut off by a kill at t=5 that never happened.
		{"unknown write that never happened", []porcupine.Operation{set(0, 0, 1, "x", 1), unknownOp(set(1, 2, 3, "y", 0), 5), get(0, 6, 7, "x", 0, 1)}, true},
		// The same write, found after the restart: it happened before the kill.
		{"unknown write that happened", []porcupine.Operation{set(0, 0, 1, "x", 1), unknownOp(set(1, 2, 3, "y", 0), 5), get(0, 6, 7, "y", 0, 2)}, true},
		// It cannot happen after the kill that ended its server.
		{"unknown write after its kill", []porcupine.Operation{set(0, 0, 1, "x", 1), unknownOp(set(1, 2, 3, "y", 0), 5), get(0, 6, 7, "x", 0, 1), get(0, 8, 9, "y", 0, 2)}, false},
		// An acknowledged write lost by a crash: its log_id is handed out again.
		{"acknowledged write lost", []porcupine.Operation{set(0, 0, 1, "x", 1), incr(1, 2, 3, 1, 1, 2), incr(1, 10, 11, 1, 1, 2)}, false},
		{"stale read", []porcupine.Operation{set(0, 0, 1, "x", 1), set(0, 2, 3, "y", 2), get(1, 4, 5, "x", 0, 1)}, false},
		{"increment lost its value", []porcupine.Operation{incr(0, 0, 1, 3, 3, 1), incr(0, 2, 3, 3, 3, 2)}, false},
	} {
		got := checkKV(c.ops, 10*time.Second)
		if want := map[bool]porcupine.CheckResult{true: porcupine.Ok, false: porcupine.Illegal}[c.legal]; got != want {
			t.Errorf("%s: %v, want %v", c.name, got, want)
		}
	}
}

func TestBoundUnknown_TheFirstKillAfterTheErrorWasSeen(t *testing.T) {
	h := []porcupine.Operation{
		unknownOp(set(0, 1, 0, "a", 0), 4),  // error seen at 4
		unknownOp(set(0, 5, 0, "b", 0), 10), // seen at 10, exactly a kill: the next one
		unknownOp(set(0, 11, 0, "c", 0), 31),
		set(0, 2, 3, "d", 1),
	}
	boundUnknown(h, []int64{10, 20, 30})
	for i, want := range []int64{10, 20, unknownReturn, 3} {
		if h[i].Return != want {
			t.Errorf("op %d: return %d, want %d", i, h[i].Return, want)
		}
	}
}

// The cut keeps a legal history legal where a plain prefix would not: A is
// called first but linearized after B, which is called later.
func TestCutAt_IsSound(t *testing.T) {
	h := []porcupine.Operation{set(0, 0, 10, "a", 2), set(1, 1, 2, "b", 1), get(2, 3, 4, "b", 0, 1), get(2, 11, 12, "a", 0, 2)}
	if checkKV(h, 10*time.Second) != porcupine.Ok {
		t.Fatal("the whole history should be legal")
	}
	if checkKV(h[:1], 10*time.Second) != porcupine.Illegal {
		t.Fatal("a plain prefix of the first operation should be illegal (the reason for the cut)")
	}
	for n := 1; n <= len(h); n++ {
		if got := checkKV(cutAt(h, n), 10*time.Second); got != porcupine.Ok {
			t.Errorf("cut at %d: %v", n, got)
		}
	}
}

func TestMinimize_EndsWhereTheHistoryWentWrong(t *testing.T) {
	var h []porcupine.Operation
	var tm int64
	for i := 1; i <= 200; i++ {
		h = append(h, incr(i%4, tm, tm+1, 1, int64(i), uint64(i)), get((i+1)%4, tm+2, tm+3, "", int64(i), uint64(i)))
		tm += 4
	}
	// Write 150 acknowledged, then forgotten: write 151 returns log_id 150.
	h[2*150] = incr(0, h[2*150].Call, h[2*150].Return, 1, 150, 150)
	if checkKV(h, 10*time.Second) != porcupine.Illegal {
		t.Fatal("the history should be illegal")
	}
	m := minimize(h, time.Second, 10*time.Second)
	last := m[len(m)-1]
	if in, out := last.Input.(kvInput), last.Output.(kvOutput); in.Op != "incr" || out.LogID != 150 || out.N != 150 {
		t.Fatalf("last operation %s, want the increment that reused log_id 150", describe(in, out))
	}
	for _, op := range m {
		if op.Input.(kvInput).Op == "get" {
			t.Fatalf("a read that explains nothing was kept: %s", describe(op.Input.(kvInput), op.Output.(kvOutput)))
		}
	}
	if s := formatHistory(m); !strings.Contains(s, "earlier operations not shown") {
		t.Fatalf("a history of %d operations printed whole:\n%s", len(m), s)
	}
}
