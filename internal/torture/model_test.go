package torture

import (
	"encoding/json"
	"fmt"
	"math/rand"
	"reflect"
	"strconv"
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

// found is op with its outcome found in the change log after the error was
// seen at ret: log_id logID.
func found(op porcupine.Operation, ret int64, logID uint64) porcupine.Operation {
	op.Output, op.Return = kvOutput{Found: true, LogID: logID, N: op.Output.(kvOutput).N}, ret
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
		found(set(0, 6, 0, "e", 0), 12, 2), // found in the change log, seen at 12
	}
	boundUnknown(h, []int64{10, 20, 30})
	for i, want := range []int64{10, 20, unknownReturn, 3, 20} {
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

func logSet(id uint64, v string) changeLogItem {
	return changeLogItem{LogID: id, Key: "a", Value: json.RawMessage(strconv.Quote(v))}
}

func logN(id uint64, n int64) changeLogItem {
	return changeLogItem{LogID: id, Key: "n", Value: json.RawMessage(strconv.FormatInt(n, 10))}
}

func TestResolveUnknown_SettlesWritesFromTheChangeLog(t *testing.T) {
	h := []porcupine.Operation{
		set(0, 0, 1, "x", 1),
		unknownOp(set(1, 2, 3, "y", 0), unknownReturn),   // in the log at 2
		unknownOp(incr(2, 2, 3, 7, 0, 0), unknownReturn), // in the log at 3: n 0 -> 7
		unknownOp(set(3, 2, 3, "z", 0), unknownReturn),   // not in the log
		unknownOp(incr(0, 4, 5, 9, 0, 0), unknownReturn), // not in the log
		get(3, 4, 5, "y", 0, 2),
		incr(1, 6, 7, 2, 9, 4),
		get(0, 8, 9, "y", 9, 4),
	}
	log := []changeLogItem{logSet(1, "x"), logSet(2, "y"), logN(3, 7), logN(4, 9)}
	got, wrong := resolveUnknown(h, log)
	if len(wrong) > 0 {
		t.Fatalf("failures: %v", wrong)
	}
	var desc []string
	for _, op := range got {
		desc = append(desc, describe(op.Input.(kvInput), op.Output.(kvOutput)))
	}
	want := []string{
		`set a="x" -> log_id=1`,
		`set a="y" -> unknown, found in the change log: log_id=2`,
		`incr n by 7 -> unknown, found in the change log: n=7 log_id=3`,
		`get -> a="y"(true) n=0 log_id=2`,
		`incr n by 2 -> n=9 log_id=4`,
		`get -> a="y"(true) n=9 log_id=4`,
	}
	if strings.Join(desc, "\n") != strings.Join(want, "\n") {
		t.Fatalf("settled history:\n%s\nwant:\n%s", strings.Join(desc, "\n"), strings.Join(want, "\n"))
	}
	if r := checkKV(got, 10*time.Second); r != porcupine.Ok {
		t.Fatalf("settled history: %v", r)
	}
	// A found write must fall at its log_id: with the two found writes' log_ids
	// swapped, the read of a="y" at log_id 2 is explained by no order.
	swapped := append([]porcupine.Operation(nil), got...)
	swapped[1].Output = kvOutput{Found: true, LogID: 3}
	swapped[2].Output = kvOutput{Found: true, LogID: 2, N: 7}
	if r := checkKV(swapped, 10*time.Second); r != porcupine.Illegal {
		t.Fatalf("found writes out of their log order: %v, want Illegal", r)
	}
	if r := checkKV(h, 10*time.Second); r != porcupine.Ok {
		t.Fatalf("the history before settling: %v", r)
	}
}

func TestResolveUnknown_FailuresAndWhatItLeavesAlone(t *testing.T) {
	base := []changeLogItem{logSet(1, "x"), logN(2, 3)}
	for _, c := range []struct {
		name      string
		h         []porcupine.Operation
		log       []changeLogItem
		wrong     string // a failure containing this, "" for none
		unchanged bool   // the history comes back as it went in
	}{
		{"acknowledged write missing", []porcupine.Operation{set(0, 0, 1, "x", 1), incr(0, 2, 3, 3, 3, 2), set(0, 4, 5, "w", 3)}, base,
			`set a="w" -> log_id=3 was acknowledged, and log_id 3 is not in the change log (it ends at 2)`, false},
		{"acknowledged write, other entry", []porcupine.Operation{set(0, 0, 1, "q", 1)}, base,
			`set a="q" -> log_id=1 was acknowledged, and the change log's entry 1 is set x`, false},
		{"acknowledged increment, other value", []porcupine.Operation{set(0, 0, 1, "x", 1), incr(0, 2, 3, 3, 4, 2)}, base,
			`the change log's entry 2 is incr 3`, false},
		{"applied twice", []porcupine.Operation{unknownOp(set(0, 0, 1, "x", 0), unknownReturn)}, []changeLogItem{logSet(1, "x"), logSet(2, "x")},
			`took effect 2 times, at log_ids [1 2]`, false},
		{"two writes alike stay unknown", []porcupine.Operation{unknownOp(incr(0, 0, 1, 3, 0, 0), unknownReturn), unknownOp(incr(1, 0, 1, 3, 0, 0), unknownReturn)},
			[]changeLogItem{logN(1, 3)}, "", true},
		{"compacted log", []porcupine.Operation{unknownOp(set(0, 0, 1, "y", 0), unknownReturn)}, []changeLogItem{logSet(5, "x")}, "", true},
		{"no log", []porcupine.Operation{unknownOp(set(0, 0, 1, "y", 0), unknownReturn)}, nil, "", true},
		{"a slot nobody writes", []porcupine.Operation{unknownOp(set(0, 0, 1, "y", 0), unknownReturn)}, []changeLogItem{{LogID: 1, Key: "b", Value: json.RawMessage(`1`)}},
			`changes slot "b"`, true},
	} {
		got, wrong := resolveUnknown(c.h, c.log)
		switch all := strings.Join(wrong, "; "); {
		case c.wrong == "" && all != "":
			t.Errorf("%s: failures %q, want none", c.name, all)
		case c.wrong != "" && !strings.Contains(all, c.wrong):
			t.Errorf("%s: failures %q, want one with %q", c.name, all, c.wrong)
		}
		if c.unchanged && !reflect.DeepEqual(got, c.h) {
			t.Errorf("%s: history changed: %v", c.name, got)
		}
	}
}

// A long history with many writes of unknown outcome, each possibly applied up
// to the end (as in a cluster, where only the final kill bounds them) and half
// of them applied late, checks at once once the change log has settled them.
// Unsettled, the same history ran the check out of time (porcupine.Unknown
// after 60 s; about 15 writes are open at any moment).
func TestResolveUnknown_ManyOpenWritesCheckQuickly(t *testing.T) {
	h, log := simulatedHistory(rand.New(rand.NewSource(1)), 2000, 100)
	unknown := 0
	for _, op := range h {
		if op.Output.(kvOutput).Unknown {
			unknown++
		}
	}
	if unknown != 100 {
		t.Fatalf("%d unknown writes, want 100", unknown)
	}
	got, wrong := resolveUnknown(h, log)
	if len(wrong) > 0 {
		t.Fatalf("failures: %v", wrong)
	}
	for _, op := range got {
		if op.Output.(kvOutput).Unknown {
			t.Fatalf("left unknown: %s", describe(op.Input.(kvInput), op.Output.(kvOutput)))
		}
	}
	if r := checkKV(got, 60*time.Second); r != porcupine.Ok {
		t.Fatalf("settled history of %d operations: %v", len(got), r)
	}
}

// simulatedHistory is one object's history from 8 clients with overlapping
// calls, applied in call order; `unknown` of its writes lose their reply and
// stay open to the end. Half of those never take effect; the other half take
// effect late, up to 300 operations after their call, as a request a node
// delivers after reconnecting does. It returns the history and the object's
// change log.
func simulatedHistory(rng *rand.Rand, ops, unknown int) ([]porcupine.Operation, []changeLogItem) {
	var h []porcupine.Operation
	var log []changeLogItem
	var s kvState
	lost := map[int]bool{}
	for len(lost) < unknown {
		lost[rng.Intn(ops)] = true
	}
	late := map[int][]kvInput{} // effects of lost writes, by the operation they come before
	apply := func(in kvInput) {
		s.LogID++
		if in.Op == "set" {
			s.A, s.HasA = in.Value, true
			log = append(log, logSet(s.LogID, in.Value))
		} else {
			s.N += in.By
			log = append(log, logN(s.LogID, s.N))
		}
	}
	for i := range ops {
		for _, in := range late[i] {
			apply(in)
		}
		call := int64(10 * i)
		ret := call + 5 + rng.Int63n(60)
		c := i % 8
		var op porcupine.Operation
		switch p := rng.Intn(10); {
		case p < 4 || lost[i]:
			var in kvInput
			if rng.Intn(2) == 0 {
				in = kvInput{Op: "set", Value: fmt.Sprintf("v%d", i)}
				op = set(c, call, ret, in.Value, s.LogID+1)
			} else {
				in = kvInput{Op: "incr", By: int64(1 + i)}
				op = incr(c, call, ret, in.By, s.N+in.By, s.LogID+1)
			}
			switch {
			case !lost[i]:
				apply(in)
			case i%2 == 0:
				j := i + 1 + rng.Intn(300)
				late[j] = append(late[j], in)
				op = unknownOp(op, unknownReturn)
			default:
				op = unknownOp(op, unknownReturn)
			}
		default:
			op = get(c, call, ret, s.A, s.N, s.LogID)
		}
		h = append(h, op)
	}
	return h, log
}
