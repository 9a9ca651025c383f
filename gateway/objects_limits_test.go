package gateway

import (
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/holdfast/holdfast/cluster"
)

const (
	mib       = 1 << 20
	maxBody   = 8 * mib  // spec/README.md
	maxValue  = 1 * mib  // spec/objects.md: one slot's value
	maxObject = 16 * mib // spec/objects.md: sum of slot names and values
)

// padTo pads a JSON text that ends with its closing bracket to exactly n bytes
// with spaces before that bracket.
func padTo(open string, closing string, n int) string {
	return open + strings.Repeat(" ", n-len(open)-len(closing)) + closing
}

func TestObjects_BodyTooLarge(t *testing.T) {
	ts := newTestServer(t, cluster.Config{})
	o := objPath("doc", "d1")
	mustDo(t, ts, "PATCH", o, `{"a":1,"n":1,"l":[]}`, http.StatusOK)
	// Valid JSON, one byte over the limit; the slot values would be small.
	over := func(open, closing string) string { return padTo(open, closing, maxBody+1) }
	runRefusals(t, ts, "doc", "d1", []refusal{
		{name: "put", method: "PUT", path: o + "/a", body: over(`{"value":2`, `}`), status: 413, code: "too_large"},
		{name: "put big string", method: "PUT", path: o + "/a", body: `{"value":` + jsonString(maxBody+1-len(`{"value":}`)) + `}`, status: 413, code: "too_large"},
		{name: "patch", method: "PATCH", path: o, body: over(`{"a":2`, `}`), status: 413, code: "too_large"},
		{name: "increment", method: "POST", path: o + "/n/increment", body: over(`{"by":2`, `}`), status: 413, code: "too_large"},
		{name: "append", method: "POST", path: o + "/l/append", body: over(`{"value":2`, `}`), status: 413, code: "too_large"},
		{name: "transaction", method: "POST", path: o + "/transaction", body: over(`[{"op":"set","key":"a","value":2}`, `]`), status: 413, code: "too_large"},
		{name: "far over", method: "PUT", path: o + "/a", body: padTo(`{"value":2`, `}`, 3*maxBody), status: 413, code: "too_large"},
	})
	wantSnap(t, ts, "doc", "d1", 1, map[string]string{"a": "1", "n": "1", "l": "[]"})

	// Exactly 8 MiB is accepted.
	exact := func(open, closing string) string { return padTo(open, closing, maxBody) }
	wantJSON(t, ts.do("PUT", o+"/a", exact(`{"value":2`, `}`), nil), http.StatusOK, `{"log_id":2}`)
	wantJSON(t, ts.do("PATCH", o, exact(`{"b":3`, `}`), nil), http.StatusOK, `{"log_id":3}`)
	wantJSON(t, ts.do("POST", o+"/n/increment", exact(`{"by":2`, `}`), nil), http.StatusOK, `{"log_id":4,"value":3}`)
	wantJSON(t, ts.do("POST", o+"/l/append", exact(`{"value":2`, `}`), nil), http.StatusOK, `{"log_id":5}`)
	wantJSON(t, ts.do("POST", o+"/transaction", exact(`[{"op":"set","key":"c","value":4}`, `]`), nil), http.StatusOK, `{"log_id":6}`)
	wantSnap(t, ts, "doc", "d1", 6, map[string]string{"a": "2", "b": "3", "n": "3", "l": "[2]", "c": "4"})
}

func TestObjects_SlotValueTooLarge(t *testing.T) {
	ts := newTestServer(t, cluster.Config{})
	o := objPath("doc", "d1")
	// A list of exactly maxValue-2 bytes: appending 1 makes it exactly maxValue.
	nearFull := `[` + jsonString(maxValue-4) + `]`
	mustDo(t, ts, "PATCH", o, `{"a":1,"l":`+nearFull+`}`, http.StatusOK) // 1
	overValue := jsonString(maxValue + 1)
	runRefusals(t, ts, "doc", "d1", []refusal{
		{name: "put", method: "PUT", path: o + "/a", body: `{"value":` + overValue + `}`, status: 413, code: "too_large"},
		{name: "put new slot", method: "PUT", path: o + "/b", body: `{"value":` + overValue + `}`, status: 413, code: "too_large"},
		{name: "put list", method: "PUT", path: o + "/b", body: `{"value":[` + jsonString(maxValue-1) + `]}`, status: 413, code: "too_large"},
		{name: "patch", method: "PATCH", path: o, body: `{"a":2,"b":` + overValue + `,"c":3}`, status: 413, code: "too_large"},
		{name: "append new slot", method: "POST", path: o + "/b/append", body: `{"value":` + jsonString(maxValue-1) + `}`, status: 413, code: "too_large"},
		{name: "append element over", method: "POST", path: o + "/b/append", body: `{"value":` + overValue + `}`, status: 413, code: "too_large"},
		{name: "append growing the list past the limit", method: "POST", path: o + "/l/append", body: `{"value":12}`, status: 413, code: "too_large"},
		{name: "transaction set", method: "POST", path: o + "/transaction", body: `[{"op":"set","key":"a","value":2},{"op":"set","key":"b","value":` + overValue + `}]`, status: 413, code: "too_large"},
		{name: "transaction appends", method: "POST", path: o + "/transaction", body: `[{"op":"append","key":"l","value":1},{"op":"append","key":"l","value":2}]`, status: 413, code: "too_large"},
	})
	wantSnap(t, ts, "doc", "d1", 1, map[string]string{"a": "1", "l": nearFull})

	// Exactly 1 MiB is accepted, compacted size counts.
	exactValue := jsonString(maxValue)
	wantJSON(t, ts.do("POST", o+"/l/append", `{"value":1}`, nil), http.StatusOK, `{"log_id":2}`)
	wantJSON(t, ts.do("PUT", o+"/b", `{"value":`+exactValue+`}`, nil), http.StatusOK, `{"log_id":3}`)
	wantJSON(t, ts.do("PATCH", o, `{"c":`+exactValue+`}`, nil), http.StatusOK, `{"log_id":4}`)
	wantJSON(t, ts.do("POST", o+"/transaction", `[{"op":"set","key":"d","value":`+exactValue+`}]`, nil), http.StatusOK, `{"log_id":5}`)
	spaced := `[` + strings.Repeat(`1, `, maxValue/3) + `1]` // over 1 MiB as sent, under once compacted
	wantJSON(t, ts.do("PUT", o+"/e", `{"value":`+spaced+`}`, nil), http.StatusOK, `{"log_id":6}`)
	s := snapOf(t, ts, "doc", "d1")
	if s.logID != 6 || len(s.state["l"]) != maxValue || len(s.state["b"]) != maxValue || len(s.state["c"]) != maxValue ||
		len(s.state["d"]) != maxValue || len(s.state["e"]) != 2*(maxValue/3)+3 {
		t.Fatalf("after the writes at the limit: %v", s)
	}
}

// fullObject fills object (typ, key) to exactly maxObject bytes with 16 slots
// "s00".."s15" whose values are strings of maxValue-3 bytes, in three PATCHes.
func fullObject(t *testing.T, ts *testServer, typ, key string) map[string]string {
	t.Helper()
	state := map[string]string{}
	for _, group := range [][2]int{{0, 7}, {7, 14}, {14, 16}} {
		var members []string
		for i := group[0]; i < group[1]; i++ {
			name := fmt.Sprintf("s%02d", i)
			v := jsonString(maxValue - len(name))
			state[name] = v
			members = append(members, `"`+name+`":`+v)
		}
		mustDo(t, ts, "PATCH", objPath(typ, key), "{"+strings.Join(members, ",")+"}", http.StatusOK)
	}
	return state
}

func TestObjects_ObjectTooLarge(t *testing.T) {
	ts := newTestServer(t, cluster.Config{})
	o := objPath("doc", "d1")
	state := fullObject(t, ts, "doc", "d1") // exactly 16 MiB: allowed
	wantSnap(t, ts, "doc", "d1", 3, state)

	longer := jsonString(maxValue - 3 + 1)
	runRefusals(t, ts, "doc", "d1", []refusal{
		{name: "put new slot", method: "PUT", path: o + "/x", body: `{"value":1}`, status: 413, code: "too_large"},
		{name: "put longer value", method: "PUT", path: o + "/s00", body: `{"value":` + longer + `}`, status: 413, code: "too_large"},
		{name: "patch", method: "PATCH", path: o, body: `{"x":1}`, status: 413, code: "too_large"},
		{name: "patch deleting less than it adds", method: "PATCH", path: o, body: `{"s00":null,"x":` + jsonString(maxValue) + `}`, status: 413, code: "too_large"},
		{name: "increment new slot", method: "POST", path: o + "/x/increment", body: ``, status: 413, code: "too_large"},
		{name: "append new slot", method: "POST", path: o + "/x/append", body: `{"value":1}`, status: 413, code: "too_large"},
		{name: "transaction", method: "POST", path: o + "/transaction", body: `[{"op":"delete","key":"s00"},{"op":"set","key":"big","value":` + jsonString(maxValue) + `}]`, status: 413, code: "too_large"},
	})
	wantSnap(t, ts, "doc", "d1", 3, state)

	// Writes that keep the object at or under 16 MiB go through.
	shorter := jsonString(maxValue - 3 - 2)
	wantJSON(t, ts.do("PUT", o+"/s00", `{"value":`+shorter+`}`, nil), http.StatusOK, `{"log_id":4}`)
	wantJSON(t, ts.do("PUT", o+"/x", `{"value":1}`, nil), http.StatusOK, `{"log_id":5}`) // back to exactly 16 MiB
	before := snapOf(t, ts, "doc", "d1")
	wantError(t, ts.do("POST", o+"/x/increment", `{"by":10}`, nil), http.StatusRequestEntityTooLarge, "too_large", nil)
	wantUnchanged(t, ts, "doc", "d1", before)
	wantJSON(t, ts.do("PATCH", o, `{"s01":null,"y":`+jsonString(maxValue-1)+`}`, nil), http.StatusOK, `{"log_id":6}`)
	wantJSON(t, ts.do("POST", o+"/x/increment", `{"by":8}`, nil), http.StatusOK, `{"log_id":7,"value":9}`)
	state["s00"], state["x"], state["y"] = shorter, "9", jsonString(maxValue-1)
	delete(state, "s01")
	wantSnap(t, ts, "doc", "d1", 7, state)
	wantJSON(t, ts.do("DELETE", o+"/s02", nil, nil), http.StatusOK, `{"log_id":8}`)
	wantNoContent(t, ts.do("DELETE", o, nil, nil))
	wantSnap(t, ts, "doc", "d1", 9, nil)
}

// TestObjects_LargeTransactionWithinLimits: a transaction whose every slot stays
// under 1 MiB and whose object stays under 16 MiB is accepted, however much of the
// state it changes.
func TestObjects_LargeTransactionWithinLimits(t *testing.T) {
	ts := newTestServer(t, cluster.Config{})
	o := objPath("doc", "d1")
	const value = 1_000_000
	list := `[` + jsonString(value-2) + `]`
	state := map[string]string{}
	var ops []string
	for _, group := range [][2]int{{0, 7}, {7, 14}, {14, 16}} {
		var members []string
		for i := group[0]; i < group[1]; i++ {
			name := fmt.Sprintf("l%02d", i)
			members = append(members, `"`+name+`":`+list)
			state[name] = list[:len(list)-1] + `,1]`
			ops = append(ops, `{"op":"append","key":"`+name+`","value":1}`)
		}
		mustDo(t, ts, "PATCH", o, "{"+strings.Join(members, ",")+"}", http.StatusOK)
	}
	before := snapOf(t, ts, "doc", "d1")
	r := ts.do("POST", o+"/transaction", "["+strings.Join(ops, ",")+"]", nil)
	if r.status != http.StatusOK {
		// Refused: then, as every 4xx, it must have written nothing, and the
		// object must go on working.
		t.Errorf("transaction within the limits: status %d, want 200; body %s", r.status, r.body)
		wantUnchanged(t, ts, "doc", "d1", before)
		wantJSON(t, ts.do("PUT", o+"/after", `{"value":1}`, nil), http.StatusOK, `{"log_id":4}`)
		return
	}
	wantJSON(t, r, http.StatusOK, `{"log_id":4}`)
	wantSnap(t, ts, "doc", "d1", 4, state)
}
