package gateway

import (
	"net/http"
	"strings"
	"testing"

	"github.com/holdfast/holdfast/cluster"
)

func TestObjects_Transaction(t *testing.T) {
	ts := newTestServer(t, cluster.Config{})
	o := objPath("order", "o1")
	mustDo(t, ts, "PATCH", o, `{"old":"x","n":1,"l":[0],"keep":true}`, http.StatusOK)

	// Ops apply in order against the state changed by earlier ops; each touched
	// slot is listed once, in first-touch order, with its final value.
	body := `[
		{"op":"set","key":"status","value":{ "s" : "new" }},
		{"op":"increment","key":"n","by":2},
		{"op":"append","key":"l","value":1},
		{"op":"delete","key":"old"},
		{"op":"set","key":"status","value":"shipped"},
		{"op":"increment","key":"n"},
		{"op":"append","key":"l","value":null},
		{"op":"increment","key":"fresh","by":0.5},
		{"op":"append","key":"newlist","value":"a"}
	]`
	wantJSON(t, ts.do("POST", o+"/transaction", body, nil), http.StatusOK, `{"log_id":2}`)
	wantSnap(t, ts, "order", "o1", 2, map[string]string{
		"status": `"shipped"`, "n": "4", "l": "[0,1,null]", "keep": "true", "fresh": "0.5", "newlist": `["a"]`,
	})
	wantJSON(t, ts.do("GET", o+"/log?after=1", nil, nil), http.StatusOK, `{"items":[
		{"key":"status","value":"shipped","log_id":2},
		{"key":"n","value":4,"log_id":2},
		{"key":"l","value":[0,1,null],"log_id":2},
		{"key":"old","value":null,"log_id":2},
		{"key":"fresh","value":0.5,"log_id":2},
		{"key":"newlist","value":["a"],"log_id":2}
	]}`)

	// A set then delete of a slot that did not exist is left out.
	wantJSON(t, ts.do("POST", o+"/transaction", `[{"op":"set","key":"tmp","value":1},{"op":"set","key":"a","value":1},{"op":"delete","key":"tmp"}]`, nil), http.StatusOK, `{"log_id":3}`)
	wantJSON(t, ts.do("GET", o+"/log?after=2", nil, nil), http.StatusOK, `{"items":[{"key":"a","value":1,"log_id":3}]}`)

	// A set then delete of an existing slot is a deletion.
	wantJSON(t, ts.do("POST", o+"/transaction", `[{"op":"set","key":"keep","value":2},{"op":"delete","key":"keep"}]`, nil), http.StatusOK, `{"log_id":4}`)
	wantJSON(t, ts.do("GET", o+"/log?after=3", nil, nil), http.StatusOK, `{"items":[{"key":"keep","value":null,"log_id":4}]}`)
	wantSnap(t, ts, "order", "o1", 4, map[string]string{
		"status": `"shipped"`, "n": "4", "l": "[0,1,null]", "fresh": "0.5", "newlist": `["a"]`, "a": "1",
	})

	// A delete then re-create within the transaction.
	wantJSON(t, ts.do("POST", o+"/transaction", `[{"op":"delete","key":"n"},{"op":"increment","key":"n","by":7}]`, nil), http.StatusOK, `{"log_id":5}`)
	wantJSON(t, ts.do("GET", o+"/log?after=4", nil, nil), http.StatusOK, `{"items":[{"key":"n","value":7,"log_id":5}]}`)

	// The App Key as path app.
	wantJSON(t, ts.do("POST", appObjPath(testApp.Key, "order", "o1", "transaction"), `[{"op":"set","key":"b","value":2}]`, nil), http.StatusOK, `{"log_id":6}`)
	wantSnap(t, ts, "order", "o1", 6, map[string]string{
		"status": `"shipped"`, "n": "7", "l": "[0,1,null]", "fresh": "0.5", "newlist": `["a"]`, "a": "1", "b": "2",
	})
}

// TestObjects_TransactionNoChange: a transaction that changes nothing writes nothing
// and returns the current log_id.
func TestObjects_TransactionNoChange(t *testing.T) {
	ts := newTestServer(t, cluster.Config{})
	o := objPath("order", "o1")
	mustDo(t, ts, "PUT", o+"/a", `{"value":1}`, http.StatusOK)
	for _, body := range []string{
		`[{"op":"delete","key":"missing"}]`,
		`[{"op":"set","key":"tmp","value":1},{"op":"delete","key":"tmp"}]`,
		`[{"op":"append","key":"tmp","value":1},{"op":"increment","key":"tmp2"},{"op":"delete","key":"tmp"},{"op":"delete","key":"tmp2"}]`,
	} {
		wantJSON(t, ts.do("POST", o+"/transaction", body, nil), http.StatusOK, `{"log_id":1}`)
		wantSnap(t, ts, "order", "o1", 1, map[string]string{"a": "1"})
	}
	wantJSON(t, ts.do("POST", objPath("order", "fresh", "transaction"), `[{"op":"delete","key":"x"}]`, nil), http.StatusOK, `{"log_id":0}`)
	wantSnap(t, ts, "order", "fresh", 0, nil)
	wantJSON(t, ts.do("GET", o+"/log", nil, nil), http.StatusOK, `{"items":[{"key":"a","value":1,"log_id":1}]}`)
}

// TestObjects_TransactionReply: the seed's reply to POST /transaction is
// {"log_id": N}, whatever the ops are.
func TestObjects_TransactionReply(t *testing.T) {
	ts := newTestServer(t, cluster.Config{})
	o := objPath("order", "o1")
	for i, body := range []string{
		`[{"op":"set","key":"a","value":1}]`,
		`[{"op":"increment","key":"n","by":2}]`,
		`[{"op":"increment","key":"n"},{"op":"increment","key":"m"}]`,
		`[{"op":"append","key":"l","value":1}]`,
	} {
		wantJSON(t, ts.do("POST", o+"/transaction", body, nil), http.StatusOK, `{"log_id":`+itoa(i+1)+`}`)
	}
	wantSnap(t, ts, "order", "o1", 4, map[string]string{"a": "1", "n": "3", "m": "1", "l": "[1]"})
}

func TestObjects_TransactionMaxOps(t *testing.T) {
	ts := newTestServer(t, cluster.Config{})
	o := objPath("order", "o1")
	ops := func(n int) string {
		parts := make([]string, n)
		for i := range parts {
			parts[i] = `{"op":"increment","key":"n"}`
		}
		return "[" + strings.Join(parts, ",") + "]"
	}
	wantJSON(t, ts.do("POST", o+"/transaction", ops(1000), nil), http.StatusOK, `{"log_id":1}`)
	wantSnap(t, ts, "order", "o1", 1, map[string]string{"n": "1000"})
	wantJSON(t, ts.do("GET", o+"/log", nil, nil), http.StatusOK, `{"items":[{"key":"n","value":1000,"log_id":1}]}`)

	before := snapOf(t, ts, "order", "o1")
	wantError(t, ts.do("POST", o+"/transaction", ops(1001), nil), http.StatusUnprocessableEntity, "invalid", nil)
	wantUnchanged(t, ts, "order", "o1", before)
}

func TestObjects_TransactionRefused(t *testing.T) {
	ts := newTestServer(t, cluster.Config{})
	o := objPath("order", "o1")
	mustDo(t, ts, "PATCH", o, `{"n":1,"s":"x","l":[1],"obj":{"a":1},"max":9223372036854775807}`, http.StatusOK)
	tx := o + "/transaction"
	// first is a valid op that must not be written when a later op fails.
	const first = `{"op":"set","key":"written","value":1},{"op":"increment","key":"n"},`
	bad := func(name, ops string) refusal {
		return refusal{name: name, method: "POST", path: tx, body: "[" + first + ops + "]", status: 422, code: "invalid"}
	}
	cases := []refusal{
		{name: "empty body", method: "POST", path: tx, body: "", status: 400, code: "bad_request"},
		{name: "object", method: "POST", path: tx, body: `{"op":"set","key":"a","value":1}`, status: 400, code: "bad_request"},
		{name: "null", method: "POST", path: tx, body: `null`, status: 400, code: "bad_request"},
		{name: "string", method: "POST", path: tx, body: `"[]"`, status: 400, code: "bad_request"},
		{name: "number", method: "POST", path: tx, body: `1`, status: 400, code: "bad_request"},
		{name: "unterminated", method: "POST", path: tx, body: `[{"op":"set","key":"a","value":1}`, status: 400, code: "bad_request"},
		{name: "trailing garbage", method: "POST", path: tx, body: `[{"op":"set","key":"a","value":1}] x`, status: 400, code: "bad_request"},
		{name: "two arrays", method: "POST", path: tx, body: `[][]`, status: 400, code: "bad_request"},
		{name: "empty list", method: "POST", path: tx, body: `[]`, status: 422, code: "invalid"},
		{name: "empty list with spaces", method: "POST", path: tx, body: ` [ ] `, status: 422, code: "invalid"},
		bad("element number", `1`),
		bad("element null", `null`),
		bad("element string", `"set"`),
		bad("element list", `[{"op":"set","key":"a","value":1}]`),
		bad("op number", `{"op":1,"key":"a","value":1}`),
		bad("op null", `{"op":null,"key":"a","value":1}`),
		bad("op list", `{"op":["set"],"key":"a","value":1}`),
		bad("key number", `{"op":"set","key":1,"value":1}`),
		bad("key null", `{"op":"set","key":null,"value":1}`),
		bad("key object", `{"op":"set","key":{},"value":1}`),
		bad("unknown op", `{"op":"put","key":"a","value":1}`),
		bad("op in capitals", `{"op":"SET","key":"a","value":1}`),
		bad("missing op", `{"key":"a","value":1}`),
		bad("empty op", `{"op":"","key":"a","value":1}`),
		bad("missing key", `{"op":"set","value":1}`),
		bad("empty key", `{"op":"set","key":"","value":1}`),
		bad("set without value", `{"op":"set","key":"a"}`),
		bad("set null", `{"op":"set","key":"a","value":null}`),
		bad("append without value", `{"op":"append","key":"l"}`),
		bad("increment by string", `{"op":"increment","key":"n","by":"1"}`),
		bad("increment by null", `{"op":"increment","key":"n","by":null}`),
		bad("increment by bool", `{"op":"increment","key":"n","by":true}`),
		bad("increment of a string", `{"op":"increment","key":"s"}`),
		bad("increment of a list", `{"op":"increment","key":"l"}`),
		bad("increment overflow", `{"op":"increment","key":"max"}`),
		bad("increment of a slot set to a string earlier", `{"op":"set","key":"z","value":"q"},{"op":"increment","key":"z"}`),
		bad("append to a number", `{"op":"append","key":"n","value":1}`),
		bad("append to an object", `{"op":"append","key":"obj","value":1}`),
		bad("append to a slot set to a number earlier", `{"op":"set","key":"l","value":3},{"op":"append","key":"l","value":1}`),
		bad("reserved log", `{"op":"set","key":"log","value":1}`),
		bad("reserved transaction", `{"op":"delete","key":"transaction"}`),
		bad("key with slash", `{"op":"set","key":"a/b","value":1}`),
		bad("key over 256 bytes", `{"op":"set","key":"`+strings.Repeat("k", 257)+`","value":1}`),
		bad("failing op then valid ops", `{"op":"increment","key":"s"},{"op":"set","key":"after","value":1}`),
	}
	runRefusals(t, ts, "order", "o1", cases)
	wantSnap(t, ts, "order", "o1", 1, map[string]string{"n": "1", "s": `"x"`, "l": "[1]", "obj": `{"a":1}`, "max": "9223372036854775807"})
	wantJSON(t, ts.do("GET", o+"/log?after=1", nil, nil), http.StatusOK, `{"items":[]}`)
}
