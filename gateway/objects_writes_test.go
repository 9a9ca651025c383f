package gateway

import (
	"net/http"
	"strings"
	"testing"

	"github.com/holdfast/holdfast/cluster"
)

func TestObjects_Put(t *testing.T) {
	ts := newTestServer(t, cluster.Config{})
	cases := []struct {
		name, body, stored string
	}{
		{"string", `{"value":"new"}`, `"new"`},
		{"integer", `{"value":42}`, `42`},
		{"number kept as written", `{"value":1.50}`, `1.50`},
		{"negative exponent", `{"value":-2.5e-3}`, `-2.5e-3`},
		{"false", `{"value":false}`, `false`},
		{"zero", `{"value":0}`, `0`},
		{"empty string", `{"value":""}`, `""`},
		{"empty object", `{"value":{}}`, `{}`},
		{"list with null", `{"value":[null]}`, `[null]`},
		{"compacted", "{ \"value\" :\n { \"a\" : [ 1 , 2 ] ,\t\"b c\" : \"d e\" } }", `{"a":[1,2],"b c":"d e"}`},
		{"unicode", `{"value":"h\u00e9 \"q\" é"}`, `"h\u00e9 \"q\" é"`},
		{"other members ignored", `{"value":7,"other":1}`, `7`},
	}
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			defer ts.bind(t)()
			before := snapOf(t, ts, "doc", "d1")
			r := ts.do("PUT", objPath("doc", "d1", "v"), c.body, nil)
			wantJSON(t, r, http.StatusOK, `{"log_id":`+itoa(i+1)+`}`)
			want := map[string]string{}
			for k, v := range before.state {
				want[k] = v
			}
			want["v"] = c.stored
			wantSnap(t, ts, "doc", "d1", uint64(i+1), want)
			wantJSON(t, ts.do("GET", objPath("doc", "d1", "v"), nil, nil), http.StatusOK, `{"value":`+c.stored+`}`)
		})
	}
	// A 256-byte slot name is allowed; the path app may be the App Key.
	long := strings.Repeat("s", 256)
	r := ts.do("PUT", appObjPath(testApp.Key, "doc", "d1", long), `{"value":1}`, nil)
	wantJSON(t, r, http.StatusOK, `{"log_id":`+itoa(len(cases)+1)+`}`)
	wantJSON(t, ts.do("GET", objPath("doc", "d1", long), nil, nil), http.StatusOK, `{"value":1}`)
}

func TestObjects_PutRefused(t *testing.T) {
	ts := newTestServer(t, cluster.Config{})
	mustDo(t, ts, "PUT", objPath("doc", "d1", "a"), `{"value":"keep"}`, http.StatusOK)
	p := func(slot string) string { return objPath("doc", "d1", slot) }
	runRefusals(t, ts, "doc", "d1", []refusal{
		{name: "empty body", method: "PUT", path: p("a"), body: "", status: 400, code: "bad_request"},
		{name: "null body", method: "PUT", path: p("a"), body: "null", status: 400, code: "bad_request"},
		{name: "array body", method: "PUT", path: p("a"), body: `[{"value":1}]`, status: 400, code: "bad_request"},
		{name: "string body", method: "PUT", path: p("a"), body: `"x"`, status: 400, code: "bad_request"},
		{name: "number body", method: "PUT", path: p("a"), body: `1`, status: 400, code: "bad_request"},
		{name: "invalid JSON", method: "PUT", path: p("a"), body: `{"value":`, status: 400, code: "bad_request"},
		{name: "trailing garbage", method: "PUT", path: p("a"), body: `{"value":1} x`, status: 400, code: "bad_request"},
		{name: "two values", method: "PUT", path: p("a"), body: `{"value":1}{"value":2}`, status: 400, code: "bad_request"},
		{name: "no value", method: "PUT", path: p("a"), body: `{}`, status: 400, code: "bad_request"},
		{name: "other member only", method: "PUT", path: p("a"), body: `{"val":1}`, status: 400, code: "bad_request"},
		{name: "null value", method: "PUT", path: p("a"), body: `{"value":null}`, status: 422, code: "invalid"},
		{name: "null value new slot", method: "PUT", path: p("b"), body: `{"value":null}`, status: 422, code: "invalid"},
		{name: "slot log", method: "PUT", path: p("log"), body: `{"value":1}`, status: 422, code: "invalid"},
		{name: "slot transaction", method: "PUT", path: p("transaction"), body: `{"value":1}`, status: 422, code: "invalid"},
		{name: "slot with slash", method: "PUT", path: p("a%2Fb"), body: `{"value":1}`, status: 422, code: "invalid"},
		{name: "slot over 256 bytes", method: "PUT", path: p(strings.Repeat("s", 257)), body: `{"value":1}`, status: 422, code: "invalid"},
		{name: "slot over 256 bytes in UTF-8", method: "PUT", path: p(strings.Repeat("%C3%A9", 129)), body: `{"value":1}`, status: 422, code: "invalid"},
	})
	wantSnap(t, ts, "doc", "d1", 1, map[string]string{"a": `"keep"`})
}

func TestObjects_Increment(t *testing.T) {
	ts := newTestServer(t, cluster.Config{})
	cases := []struct {
		name    string
		initial string // "" means the slot does not exist
		body    string
		want    string // the new value as written in the reply and stored
	}{
		{"missing slot, empty body", "", "", "1"},
		{"missing slot, empty object", "", `{}`, "1"},
		{"missing slot, by", "", `{"by":5}`, "5"},
		{"missing slot, by zero", "", `{"by":0}`, "0"},
		{"missing slot, float by", "", `{"by":0.5}`, "0.5"},
		{"integer", "2", `{"by":3}`, "5"},
		{"negative", "2", `{"by":-3}`, "-1"},
		{"whitespace body", "2", " \n", "3"},
		{"float plus float integral", "1.5", `{"by":1.5}`, "3.0"},
		{"integer plus integral float", "2", `{"by":1.0}`, "3.0"},
		{"integer plus exponent", "10", `{"by":1e2}`, "110.0"},
		{"float slot plus integer", "2.5", `{"by":1}`, "3.5"},
		{"integral float slot plus integer", "3.0", `{"by":1}`, "4.0"},
		{"float slot", "0.1", `{"by":0.2}`, "0.30000000000000004"},
		{"exponent slot", "1e2", `{}`, "101.0"},
		{"to max int64", "9223372036854775806", `{"by":1}`, "9223372036854775807"},
		{"to min int64", "-9223372036854775807", `{"by":-1}`, "-9223372036854775808"},
		{"other members ignored", "1", `{"by":2,"x":"y"}`, "3"},
	}
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			defer ts.bind(t)()
			key := "k" + itoa(i)
			var logID uint64
			if c.initial != "" {
				mustDo(t, ts, "PUT", objPath("counter", key, "n"), `{"value":`+c.initial+`}`, http.StatusOK)
				logID = 1
			}
			r := ts.do("POST", objPath("counter", key, "n", "increment"), c.body, nil)
			wantJSON(t, r, http.StatusOK, `{"log_id":`+itoa(int(logID+1))+`,"value":`+c.want+`}`)
			if got := strings.TrimSpace(string(r.body)); !strings.Contains(got, `"value":`+c.want+`}`) {
				t.Errorf("reply %s does not write the value as %s", got, c.want)
			}
			wantSnap(t, ts, "counter", key, logID+1, map[string]string{"n": c.want})
		})
	}

	// A float result keeps being a float on later integer increments.
	mustDo(t, ts, "PUT", objPath("counter", "f", "n"), `{"value":1.5}`, http.StatusOK)
	wantJSON(t, ts.do("POST", objPath("counter", "f", "n", "increment"), `{"by":1.5}`, nil), http.StatusOK, `{"log_id":2,"value":3.0}`)
	wantJSON(t, ts.do("POST", objPath("counter", "f", "n", "increment"), `{"by":1}`, nil), http.StatusOK, `{"log_id":3,"value":4.0}`)
	wantSnap(t, ts, "counter", "f", 3, map[string]string{"n": "4.0"})
}

func TestObjects_IncrementRefused(t *testing.T) {
	ts := newTestServer(t, cluster.Config{})
	mustDo(t, ts, "PATCH", objPath("counter", "c1"),
		`{"n":1,"str":"5","list":[1],"obj":{"a":1},"bool":true,"max":9223372036854775807,"min":-9223372036854775808,"big":1e308,"neg":-1e308}`, http.StatusOK)
	p := func(slot string) string { return objPath("counter", "c1", slot, "increment") }
	runRefusals(t, ts, "counter", "c1", []refusal{
		{name: "by string", method: "POST", path: p("n"), body: `{"by":"1"}`, status: 400, code: "bad_request"},
		{name: "by null", method: "POST", path: p("n"), body: `{"by":null}`, status: 400, code: "bad_request"},
		{name: "by true", method: "POST", path: p("n"), body: `{"by":true}`, status: 400, code: "bad_request"},
		{name: "by list", method: "POST", path: p("n"), body: `{"by":[1]}`, status: 400, code: "bad_request"},
		{name: "by object", method: "POST", path: p("n"), body: `{"by":{"n":1}}`, status: 400, code: "bad_request"},
		{name: "body null", method: "POST", path: p("n"), body: `null`, status: 400, code: "bad_request"},
		{name: "body array", method: "POST", path: p("n"), body: `[1]`, status: 400, code: "bad_request"},
		{name: "body number", method: "POST", path: p("n"), body: `1`, status: 400, code: "bad_request"},
		{name: "body invalid", method: "POST", path: p("n"), body: `{"by":`, status: 400, code: "bad_request"},
		{name: "string slot", method: "POST", path: p("str"), body: "", status: 422, code: "invalid"},
		{name: "list slot", method: "POST", path: p("list"), body: `{"by":1}`, status: 422, code: "invalid"},
		{name: "object slot", method: "POST", path: p("obj"), body: `{"by":1}`, status: 422, code: "invalid"},
		{name: "bool slot", method: "POST", path: p("bool"), body: `{"by":1}`, status: 422, code: "invalid"},
		{name: "int64 overflow", method: "POST", path: p("max"), body: `{"by":1}`, status: 422, code: "invalid"},
		{name: "int64 overflow by default", method: "POST", path: p("max"), body: ``, status: 422, code: "invalid"},
		{name: "int64 underflow", method: "POST", path: p("min"), body: `{"by":-1}`, status: 422, code: "invalid"},
		{name: "float overflow", method: "POST", path: p("big"), body: `{"by":1e308}`, status: 422, code: "invalid"},
		{name: "float overflow negative", method: "POST", path: p("neg"), body: `{"by":-1e308}`, status: 422, code: "invalid"},
		{name: "reserved log", method: "POST", path: p("log"), body: "", status: 422, code: "invalid"},
		{name: "reserved transaction", method: "POST", path: p("transaction"), body: "", status: 422, code: "invalid"},
		{name: "slot with slash", method: "POST", path: p("a%2Fb"), body: "", status: 422, code: "invalid"},
		{name: "slot over 256 bytes", method: "POST", path: p(strings.Repeat("s", 257)), body: "", status: 422, code: "invalid"},
	})
	wantSnap(t, ts, "counter", "c1", 1, map[string]string{
		"n": "1", "str": `"5"`, "list": "[1]", "obj": `{"a":1}`, "bool": "true",
		"max": "9223372036854775807", "min": "-9223372036854775808", "big": "1e308", "neg": "-1e308",
	})
}

func TestObjects_Append(t *testing.T) {
	ts := newTestServer(t, cluster.Config{})
	p := objPath("list", "l1", "items", "append")
	steps := []struct{ body, list string }{
		{`{"value":1}`, `[1]`},
		{`{"value":"x"}`, `[1,"x"]`},
		{`{"value":null}`, `[1,"x",null]`},
		{`{"value": { "a" : [ 1, 2 ] } }`, `[1,"x",null,{"a":[1,2]}]`},
		{`{"value":[]}`, `[1,"x",null,{"a":[1,2]},[]]`},
	}
	for i, s := range steps {
		wantJSON(t, ts.do("POST", p, s.body, nil), http.StatusOK, `{"log_id":`+itoa(i+1)+`}`)
		wantSnap(t, ts, "list", "l1", uint64(i+1), map[string]string{"items": s.list})
	}
	wantJSON(t, ts.do("GET", objPath("list", "l1", "items"), nil, nil), http.StatusOK, `{"value":[1,"x",null,{"a":[1,2]},[]]}`)

	// Appending to an existing empty list, and a null into a missing slot.
	mustDo(t, ts, "PUT", objPath("list", "l2", "e"), `{"value":[]}`, http.StatusOK)
	wantJSON(t, ts.do("POST", objPath("list", "l2", "e", "append"), `{"value":null}`, nil), http.StatusOK, `{"log_id":2}`)
	wantJSON(t, ts.do("POST", objPath("list", "l2", "n", "append"), `{"value":null}`, nil), http.StatusOK, `{"log_id":3}`)
	wantSnap(t, ts, "list", "l2", 3, map[string]string{"e": "[null]", "n": "[null]"})
}

func TestObjects_AppendRefused(t *testing.T) {
	ts := newTestServer(t, cluster.Config{})
	mustDo(t, ts, "PATCH", objPath("list", "l1"), `{"l":[1],"n":1,"s":"[1]","o":{"a":[1]},"b":false}`, http.StatusOK)
	p := func(slot string) string { return objPath("list", "l1", slot, "append") }
	runRefusals(t, ts, "list", "l1", []refusal{
		{name: "empty body", method: "POST", path: p("l"), body: "", status: 400, code: "bad_request"},
		{name: "no value", method: "POST", path: p("l"), body: `{}`, status: 400, code: "bad_request"},
		{name: "no value new slot", method: "POST", path: p("new"), body: `{"values":[1]}`, status: 400, code: "bad_request"},
		{name: "body null", method: "POST", path: p("l"), body: `null`, status: 400, code: "bad_request"},
		{name: "body array", method: "POST", path: p("l"), body: `[1]`, status: 400, code: "bad_request"},
		{name: "body invalid", method: "POST", path: p("l"), body: `{"value":[}`, status: 400, code: "bad_request"},
		{name: "number slot", method: "POST", path: p("n"), body: `{"value":1}`, status: 422, code: "invalid"},
		{name: "string slot", method: "POST", path: p("s"), body: `{"value":1}`, status: 422, code: "invalid"},
		{name: "object slot", method: "POST", path: p("o"), body: `{"value":1}`, status: 422, code: "invalid"},
		{name: "bool slot", method: "POST", path: p("b"), body: `{"value":1}`, status: 422, code: "invalid"},
		{name: "reserved log", method: "POST", path: p("log"), body: `{"value":1}`, status: 422, code: "invalid"},
		{name: "reserved transaction", method: "POST", path: p("transaction"), body: `{"value":1}`, status: 422, code: "invalid"},
		{name: "slot with slash", method: "POST", path: p("a%2Fb"), body: `{"value":1}`, status: 422, code: "invalid"},
		{name: "slot over 256 bytes", method: "POST", path: p(strings.Repeat("s", 257)), body: `{"value":1}`, status: 422, code: "invalid"},
	})
	wantSnap(t, ts, "list", "l1", 1, map[string]string{"l": "[1]", "n": "1", "s": `"[1]"`, "o": `{"a":[1]}`, "b": "false"})
}

func TestObjects_DeleteSlot(t *testing.T) {
	ts := newTestServer(t, cluster.Config{})
	mustDo(t, ts, "PATCH", objPath("doc", "d1"), `{"a":1,"b":2}`, http.StatusOK)

	wantJSON(t, ts.do("DELETE", objPath("doc", "d1", "a"), nil, nil), http.StatusOK, `{"log_id":2}`)
	wantSnap(t, ts, "doc", "d1", 2, map[string]string{"b": "2"})
	wantError(t, ts.do("GET", objPath("doc", "d1", "a"), nil, nil), http.StatusNotFound, "not_found", nil)
	wantJSON(t, ts.do("GET", objPath("doc", "d1", "log")+"?after=1", nil, nil), http.StatusOK,
		`{"items":[{"key":"a","value":null,"log_id":2}]}`)

	// Deleting a missing slot (again, or never written) writes nothing.
	for _, slot := range []string{"a", "never"} {
		wantJSON(t, ts.do("DELETE", objPath("doc", "d1", slot), nil, nil), http.StatusOK, `{"log_id":2}`)
		wantSnap(t, ts, "doc", "d1", 2, map[string]string{"b": "2"})
	}
	// On an object never written, too.
	wantJSON(t, ts.do("DELETE", objPath("doc", "fresh", "a"), nil, nil), http.StatusOK, `{"log_id":0}`)
	wantSnap(t, ts, "doc", "fresh", 0, nil)
	wantJSON(t, ts.do("GET", objPath("doc", "d1", "log")+"?after=2", nil, nil), http.StatusOK, `{"items":[]}`)

	p := func(slot string) string { return objPath("doc", "d1", slot) }
	runRefusals(t, ts, "doc", "d1", []refusal{
		{name: "reserved log", method: "DELETE", path: p("log"), status: 422, code: "invalid"},
		{name: "reserved transaction", method: "DELETE", path: p("transaction"), status: 422, code: "invalid"},
		{name: "slot with slash", method: "DELETE", path: p("a%2Fb"), status: 422, code: "invalid"},
		{name: "slot over 256 bytes", method: "DELETE", path: p(strings.Repeat("s", 257)), status: 422, code: "invalid"},
	})
}

func TestObjects_Patch(t *testing.T) {
	ts := newTestServer(t, cluster.Config{})
	o := objPath("doc", "d1")
	wantJSON(t, ts.do("PATCH", o, `{"a":1,"b":"x","c":[1]}`, nil), http.StatusOK, `{"log_id":1}`)
	wantSnap(t, ts, "doc", "d1", 1, map[string]string{"a": "1", "b": `"x"`, "c": "[1]"})

	// One write, one entry; members apply in body order; null deletes; values are
	// replaced whole and compacted.
	wantJSON(t, ts.do("PATCH", o+"/", "{ \"z\" : { \"n\" : [ 1 ] } , \"a\":null, \"c\" : {\"k\":2}, \"missing\": null }", nil), http.StatusOK, `{"log_id":2}`)
	wantSnap(t, ts, "doc", "d1", 2, map[string]string{"b": `"x"`, "c": `{"k":2}`, "z": `{"n":[1]}`})
	wantJSON(t, ts.do("GET", o+"/log?after=1", nil, nil), http.StatusOK,
		`{"items":[{"key":"z","value":{"n":[1]},"log_id":2},{"key":"a","value":null,"log_id":2},{"key":"c","value":{"k":2},"log_id":2}]}`)

	// Nothing to change: no entry, the current log_id.
	for _, body := range []string{`{}`, ` { } `, `{"a":null}`, `{"a":null,"never":null}`} {
		wantJSON(t, ts.do("PATCH", o, body, nil), http.StatusOK, `{"log_id":2}`)
		wantSnap(t, ts, "doc", "d1", 2, map[string]string{"b": `"x"`, "c": `{"k":2}`, "z": `{"n":[1]}`})
	}
	wantJSON(t, ts.do("PATCH", objPath("doc", "fresh"), `{}`, nil), http.StatusOK, `{"log_id":0}`)
	wantSnap(t, ts, "doc", "fresh", 0, nil)

	// The App Key as path app.
	wantJSON(t, ts.do("PATCH", appObjPath(testApp.Key, "doc", "d1"), `{"b":null}`, nil), http.StatusOK, `{"log_id":3}`)
	wantSnap(t, ts, "doc", "d1", 3, map[string]string{"c": `{"k":2}`, "z": `{"n":[1]}`})
	wantJSON(t, ts.do("GET", o+"/log?after=2", nil, nil), http.StatusOK, `{"items":[{"key":"b","value":null,"log_id":3}]}`)
}

func TestObjects_PatchRefused(t *testing.T) {
	ts := newTestServer(t, cluster.Config{})
	o := objPath("doc", "d1")
	mustDo(t, ts, "PATCH", o, `{"a":1}`, http.StatusOK)
	runRefusals(t, ts, "doc", "d1", []refusal{
		{name: "empty body", method: "PATCH", path: o, body: "", status: 400, code: "bad_request"},
		{name: "null", method: "PATCH", path: o, body: "null", status: 400, code: "bad_request"},
		{name: "array", method: "PATCH", path: o, body: `[{"a":2}]`, status: 400, code: "bad_request"},
		{name: "string", method: "PATCH", path: o, body: `"a"`, status: 400, code: "bad_request"},
		{name: "number", method: "PATCH", path: o, body: `2`, status: 400, code: "bad_request"},
		{name: "unterminated", method: "PATCH", path: o, body: `{"a":2`, status: 400, code: "bad_request"},
		{name: "missing value", method: "PATCH", path: o, body: `{"a":}`, status: 400, code: "bad_request"},
		{name: "trailing comma", method: "PATCH", path: o, body: `{"a":2,}`, status: 400, code: "bad_request"},
		{name: "bad member value", method: "PATCH", path: o, body: `{"a":tru}`, status: 400, code: "bad_request"},
		{name: "two objects", method: "PATCH", path: o, body: `{"a":2}{"b":3}`, status: 400, code: "bad_request"},
		{name: "trailing garbage", method: "PATCH", path: o, body: `{"a":2} x`, status: 400, code: "bad_request"},
		{name: "trailing bracket", method: "PATCH", path: o, body: `{"a":2}]`, status: 400, code: "bad_request"},
		{name: "reserved log", method: "PATCH", path: o, body: `{"log":1}`, status: 422, code: "invalid"},
		{name: "reserved after a valid member", method: "PATCH", path: o, body: `{"a":2,"b":3,"transaction":1}`, status: 422, code: "invalid"},
		{name: "reserved delete", method: "PATCH", path: o, body: `{"log":null}`, status: 422, code: "invalid"},
		{name: "slot with slash", method: "PATCH", path: o, body: `{"a":2,"x/y":1}`, status: 422, code: "invalid"},
		{name: "slot over 256 bytes", method: "PATCH", path: o, body: `{"a":2,"` + strings.Repeat("s", 257) + `":1}`, status: 422, code: "invalid"},
		{name: "empty slot name", method: "PATCH", path: o, body: `{"a":2,"":1}`, status: 422, code: "invalid"},
	})
	wantSnap(t, ts, "doc", "d1", 1, map[string]string{"a": "1"})
}
