package torture

import (
	"encoding/json"
	"fmt"
	"math"
	"sort"
	"strings"
	"time"

	"github.com/anishathalye/porcupine"
)

// The KV objects' model for porcupine: each object has a string slot "a", an
// integer slot "n" and its log_id. Every acknowledged write returns the log_id
// it got (and an increment its new value), so a lost or repeated write shows up
// as a history no order of operations explains.

type kvState struct {
	A     string
	HasA  bool
	N     int64
	LogID uint64
}

type kvInput struct {
	Op    string // "set", "incr", "get"
	Value string // set
	By    int64  // incr
}

type kvOutput struct {
	Unknown bool // the outcome is unknown (error after sending): it may or may not have happened
	// Found: the outcome was unknown, and the object's change log after the last
	// restart holds this very write (resolveUnknown): LogID and N are from there.
	Found bool
	LogID uint64
	N     int64  // incr: the new value; get: the slot
	A     string // get
	HasA  bool   // get
}

// kvModel is nondeterministic in one way: a write of unknown outcome (cut off by
// a kill) either took effect or never did. Its return time is the kill that
// ended the server that had it (boundUnknown; in a cluster, the kill of every
// node at the end: clusterTarget.boundUnknown), so it cannot be parked after
// every other operation; "never" has to be a state of its own.
var kvModel = (&porcupine.NondeterministicModel{
	Init: func() []any { return []any{kvState{}} },
	Step: func(state, input, output any) []any {
		s, in, out := state.(kvState), input.(kvInput), output.(kvOutput)
		var next kvState
		switch in.Op {
		case "set":
			next = kvState{A: in.Value, HasA: true, N: s.N, LogID: s.LogID + 1}
		case "incr":
			next = kvState{A: s.A, HasA: s.HasA, N: s.N + in.By, LogID: s.LogID + 1}
		default:
			if out.LogID == s.LogID && out.N == s.N && out.HasA == s.HasA && out.A == s.A {
				return []any{s}
			}
			return nil
		}
		switch {
		case out.Unknown:
			return []any{next, s}
		case out.LogID == next.LogID && (in.Op == "set" || out.N == next.N):
			return []any{next}
		}
		return nil
	},
	DescribeOperation: func(input, output any) string { return describe(input.(kvInput), output.(kvOutput)) },
	DescribeState: func(state any) string {
		s := state.(kvState)
		return fmt.Sprintf("a=%q(%v) n=%d log_id=%d", s.A, s.HasA, s.N, s.LogID)
	},
}).ToModel()

func describe(in kvInput, out kvOutput) string {
	var call string
	switch in.Op {
	case "set":
		call = fmt.Sprintf("set a=%q", in.Value)
	case "incr":
		call = fmt.Sprintf("incr n by %d", in.By)
	default:
		call = "get"
	}
	switch {
	case out.Unknown:
		return call + " -> unknown"
	case out.Found && in.Op == "incr":
		return fmt.Sprintf("%s -> unknown, found in the change log: n=%d log_id=%d", call, out.N, out.LogID)
	case out.Found:
		return fmt.Sprintf("%s -> unknown, found in the change log: log_id=%d", call, out.LogID)
	case in.Op == "get":
		return fmt.Sprintf("%s -> a=%q(%v) n=%d log_id=%d", call, out.A, out.HasA, out.N, out.LogID)
	case in.Op == "incr":
		return fmt.Sprintf("%s -> n=%d log_id=%d", call, out.N, out.LogID)
	}
	return fmt.Sprintf("%s -> log_id=%d", call, out.LogID)
}

// unknownReturn is the return time of an operation whose outcome is unknown and
// that no later kill bounds: it may take effect at any point after its call, or
// never. (Most are bounded by the next kill: see boundUnknown.)
const unknownReturn = math.MaxInt64

// checkKV checks one object's history.
func checkKV(history []porcupine.Operation, timeout time.Duration) porcupine.CheckResult {
	return porcupine.CheckOperationsTimeout(kvModel, history, timeout)
}

// smallestFailing is the smallest failing history minimize finds, as text.
func smallestFailing(history []porcupine.Operation) string {
	return formatHistory(minimize(history, 2*time.Second, 20*time.Second))
}

// minimize shrinks an illegal history in two sound steps, within a bounded
// number of checks and time:
//
//  1. The shortest illegal cut at a time T (binary search over call times): the
//     operations called before T, where one still running at T loses its
//     outcome (a write becomes unknown, a read is dropped). A legal history
//     gives a legal cut at every T: whatever was linearized after T is either
//     gone or no longer checked. Dropping every operation called after T
//     without that loosening would not be sound: a write called before T but
//     linearized after one called after T would then miss a log_id.
//  2. Reads are dropped one at a time, last first, while the cut stays
//     illegal (a read never explains anything for a later operation; writes
//     stay, since dropping one leaves a gap in log_id that is illegal anyway).
func minimize(history []porcupine.Operation, timeout, total time.Duration) []porcupine.Operation {
	h := append([]porcupine.Operation(nil), history...)
	sort.Slice(h, func(i, j int) bool { return h[i].Call < h[j].Call })
	end := time.Now().Add(total)
	illegal := func(ops []porcupine.Operation) bool {
		return porcupine.CheckOperationsTimeout(kvModel, ops, timeout) == porcupine.Illegal
	}
	lo, hi := 1, len(h)
	for lo < hi && time.Now().Before(end) {
		mid := (lo + hi) / 2
		if illegal(cutAt(h, mid)) {
			hi = mid
		} else {
			lo = mid + 1
		}
	}
	h = cutAt(h, hi)
	budget := 4 * shownOps // the reads near the end, where the failure shows
	for i := len(h) - 1; i >= 0 && budget > 0 && time.Now().Before(end); i-- {
		if h[i].Input.(kvInput).Op != "get" {
			continue
		}
		budget--
		try := append(append([]porcupine.Operation(nil), h[:i]...), h[i+1:]...)
		if illegal(try) {
			h = try
		}
	}
	return h
}

// cutAt is the cut of step 1 of minimize at the call time of h[n] (h sorted by
// call time): h[:n], with the outcomes of the operations still running then
// made unknown.
func cutAt(h []porcupine.Operation, n int) []porcupine.Operation {
	if n >= len(h) {
		return h
	}
	t := h[n].Call
	out := make([]porcupine.Operation, 0, n)
	for _, op := range h[:n] {
		if op.Return >= t {
			if op.Input.(kvInput).Op == "get" {
				continue
			}
			op.Output, op.Return = kvOutput{Unknown: true}, unknownReturn
		}
		out = append(out, op)
	}
	return out
}

// shownOps is how many operations of a failing history are printed: the last
// ones, where the cut of minimize ends and so where the history went wrong.
const shownOps = 80

func formatHistory(h []porcupine.Operation) string {
	var b strings.Builder
	base := int64(math.MaxInt64)
	for _, op := range h {
		base = min(base, op.Call)
	}
	if len(h) > shownOps {
		fmt.Fprintf(&b, "  (%d earlier operations not shown)\n", len(h)-shownOps)
		h = h[len(h)-shownOps:]
	}
	for _, op := range h {
		ret := "unknown, never bounded"
		switch {
		case (op.Output.(kvOutput).Unknown || op.Output.(kvOutput).Found) && op.Return != unknownReturn:
			ret = fmt.Sprintf("unknown, by the kill at %.3fms", float64(op.Return-base)/1e6)
		case op.Return != unknownReturn:
			ret = fmt.Sprintf("%.3fms", float64(op.Return-base)/1e6)
		}
		fmt.Fprintf(&b, "  client %2d  call %.3fms  return %s  %s\n", op.ClientId, float64(op.Call-base)/1e6, ret,
			describe(op.Input.(kvInput), op.Output.(kvOutput)))
	}
	return b.String()
}

// changeLogItem is one item of an object's change log (GET .../log), read once
// every server is back after the last kill.
type changeLogItem struct {
	LogID uint64          `json:"log_id"`
	Key   string          `json:"key"`
	Value json.RawMessage `json:"value"`
}

// resolveUnknown settles the writes of unknown outcome of one object's history
// from its change log, read after the last kill, when that log is whole (log_id
// 1 to the last one, every entry one item; nil: it could not be read). It returns the history to check and
// what it found wrong.
//
// The workload makes every write recognisable in the log: a set writes a value
// no other write of the run uses, an increment adds an amount drawn from a
// million (an increment's log item is the slot's new value, so its amount is the
// step from the previous one). A write whose value or amount is shared with
// another write of the history stays unknown. For the others:
//
//   - not in the log: it never took effect (every process that held it is dead
//     and the log is whole), so it leaves the history;
//   - in the log once: it took effect with that log_id (and, an increment, that
//     new value); it stays in the history with that outcome, still bounded by the
//     kill, so the check must place it where its log_id falls;
//   - in the log twice: it took effect twice, which is a failure.
//
// Why this is needed: an unknown write may be linearized at any point up to its
// bound, or never. In a cluster that bound is the final kill (clusterTarget.
// boundUnknown), so a dozen of them on one object multiply the check's search
// until it times out. Settled, each has one place left in the order.
//
// It is sound: it only removes outcomes the model allowed, never adds one, so a
// history it passes passed without it. A log that disagrees with the replies (an
// acknowledged write whose log_id holds another change, or is missing) is a
// failure of its own: the change log is part of the contract.
func resolveUnknown(h []porcupine.Operation, log []changeLogItem) ([]porcupine.Operation, []string) {
	if log == nil {
		return h, nil // not read
	}
	var failures []string
	// The log runs from log_id 1 without a gap (checked below), so entry x is
	// at index x-1.
	sig := make([]string, len(log)) // what each entry did
	newN := make([]int64, len(log)) // n after each entry
	at := map[string][]uint64{}     // what an entry did -> its log_ids
	var n int64
	for i, it := range log {
		if it.LogID != uint64(i+1) {
			return h, nil // compacted, or one entry of several items: settle nothing
		}
		var s string
		switch it.Key {
		case "a":
			var v string
			if json.Unmarshal(it.Value, &v) != nil {
				return h, []string{fmt.Sprintf("change log entry %d sets a to %s, not a string", it.LogID, it.Value)}
			}
			s = "set " + v
		case "n":
			var v int64
			if json.Unmarshal(it.Value, &v) != nil {
				return h, []string{fmt.Sprintf("change log entry %d sets n to %s, not an integer", it.LogID, it.Value)}
			}
			s, n = fmt.Sprintf("incr %d", v-n), v
		default:
			return h, []string{fmt.Sprintf("change log entry %d changes slot %q, which no client writes", it.LogID, it.Key)}
		}
		sig[i], newN[i] = s, n
		at[s] = append(at[s], it.LogID)
	}
	opSig := func(in kvInput) string {
		if in.Op == "set" {
			return "set " + in.Value
		}
		return fmt.Sprintf("incr %d", in.By)
	}
	writes := map[string]int{}
	for _, op := range h {
		if in := op.Input.(kvInput); in.Op != "get" {
			writes[opSig(in)]++
		}
	}
	out := make([]porcupine.Operation, 0, len(h))
	for _, op := range h {
		in, o := op.Input.(kvInput), op.Output.(kvOutput)
		if in.Op == "get" {
			out = append(out, op)
			continue
		}
		s := opSig(in)
		if !o.Unknown {
			switch x := o.LogID; {
			case x < 1 || x > uint64(len(log)):
				failures = append(failures, fmt.Sprintf("%s was acknowledged, and log_id %d is not in the change log (it ends at %d)", describe(in, o), x, len(log)))
			case sig[x-1] != s || (in.Op == "incr" && newN[x-1] != o.N):
				failures = append(failures, fmt.Sprintf("%s was acknowledged, and the change log's entry %d is %s", describe(in, o), x, sig[x-1]))
			}
			out = append(out, op)
			continue
		}
		if writes[s] > 1 {
			out = append(out, op) // not recognisable: it stays unknown
			continue
		}
		switch ids := at[s]; len(ids) {
		case 0:
			// never took effect: dropped
		case 1:
			op.Output = kvOutput{Found: true, LogID: ids[0], N: newN[ids[0]-1]}
			out = append(out, op)
		default:
			failures = append(failures, fmt.Sprintf("%s took effect %d times, at log_ids %v", describe(in, o), len(ids), ids))
			out = append(out, op)
		}
	}
	return out, failures
}
