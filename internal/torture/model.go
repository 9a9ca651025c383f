package torture

import (
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
	LogID   uint64
	N       int64  // incr: the new value; get: the slot
	A       string // get
	HasA    bool   // get
}

var kvModel = porcupine.Model{
	Init: func() any { return kvState{} },
	Step: func(state, input, output any) (bool, any) {
		s, in, out := state.(kvState), input.(kvInput), output.(kvOutput)
		switch in.Op {
		case "set":
			next := kvState{A: in.Value, HasA: true, N: s.N, LogID: s.LogID + 1}
			return out.Unknown || out.LogID == next.LogID, next
		case "incr":
			next := kvState{A: s.A, HasA: s.HasA, N: s.N + in.By, LogID: s.LogID + 1}
			return out.Unknown || (out.LogID == next.LogID && out.N == next.N), next
		default:
			return out.LogID == s.LogID && out.N == s.N && out.HasA == s.HasA && out.A == s.A, s
		}
	},
	DescribeOperation: func(input, output any) string { return describe(input.(kvInput), output.(kvOutput)) },
	DescribeState: func(state any) string {
		s := state.(kvState)
		return fmt.Sprintf("a=%q(%v) n=%d log_id=%d", s.A, s.HasA, s.N, s.LogID)
	},
}

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
	case in.Op == "get":
		return fmt.Sprintf("%s -> a=%q(%v) n=%d log_id=%d", call, out.A, out.HasA, out.N, out.LogID)
	case in.Op == "incr":
		return fmt.Sprintf("%s -> n=%d log_id=%d", call, out.N, out.LogID)
	}
	return fmt.Sprintf("%s -> log_id=%d", call, out.LogID)
}

// unknownReturn is the return time of an operation whose outcome is unknown: it
// may take effect at any point after its call, or never.
const unknownReturn = math.MaxInt64

// checkKV checks one object's history; it returns the result and, when it is
// not linearizable, the smallest failing history found (as text).
func checkKV(history []porcupine.Operation, timeout time.Duration) (porcupine.CheckResult, string) {
	res := porcupine.CheckOperationsTimeout(kvModel, history, timeout)
	if res != porcupine.Illegal {
		return res, ""
	}
	return res, formatHistory(minimize(history, 2*time.Second, 30*time.Second))
}

// minimize shrinks an illegal history: first to its shortest illegal prefix in
// call order, then by dropping single operations while it stays illegal, within
// a bounded number of checks.
func minimize(history []porcupine.Operation, timeout, total time.Duration) []porcupine.Operation {
	h := append([]porcupine.Operation(nil), history...)
	sort.Slice(h, func(i, j int) bool { return h[i].Call < h[j].Call })
	end := time.Now().Add(total)
	illegal := func(ops []porcupine.Operation) bool {
		return porcupine.CheckOperationsTimeout(kvModel, ops, timeout) == porcupine.Illegal
	}
	// A prefix keeps its operations whole; operations that returned after the
	// prefix's last call are still in it, which can only add constraints.
	lo, hi := 1, len(h)
	for lo < hi && time.Now().Before(end) {
		mid := (lo + hi) / 2
		if illegal(h[:mid]) {
			hi = mid
		} else {
			lo = mid + 1
		}
	}
	h = h[:hi]
	budget := 2000
	for i := len(h) - 1; i >= 0 && budget > 0 && time.Now().Before(end); i-- {
		budget--
		try := append(append([]porcupine.Operation(nil), h[:i]...), h[i+1:]...)
		if len(try) > 0 && illegal(try) {
			h = try
		}
	}
	return h
}

func formatHistory(h []porcupine.Operation) string {
	var b strings.Builder
	base := int64(math.MaxInt64)
	for _, op := range h {
		base = min(base, op.Call)
	}
	for _, op := range h {
		ret := "never (unknown)"
		if op.Return != unknownReturn {
			ret = fmt.Sprintf("%.3fms", float64(op.Return-base)/1e6)
		}
		fmt.Fprintf(&b, "  client %2d  call %.3fms  return %s  %s\n", op.ClientId, float64(op.Call-base)/1e6, ret,
			describe(op.Input.(kvInput), op.Output.(kvOutput)))
	}
	return b.String()
}
