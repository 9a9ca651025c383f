package gateway

import (
	"net/http"
	"strings"
	"testing"

	"github.com/holdfast/holdfast/cluster"
)

func TestObjects_IdempotencyKeyRefused(t *testing.T) {
	ts := newTestServer(t, cluster.Config{})
	o := objPath("order", "o1")
	mustDo(t, ts, "PATCH", o, `{"a":1,"n":1,"l":[]}`, http.StatusOK)
	var cases []refusal
	for _, k := range []struct{ name, key string }{
		{"empty", ""},
		{"129 bytes", strings.Repeat("k", 129)},
		{"4096 bytes", strings.Repeat("k", 4096)},
	} {
		for _, rt := range []struct {
			method, rest string
			body         any
		}{
			{"PUT", "/a", `{"value":2}`},
			{"PATCH", "", `{"a":2}`},
			{"POST", "/n/increment", `{"by":1}`},
			{"POST", "/l/append", `{"value":1}`},
			{"DELETE", "/a", nil},
			{"DELETE", "/missing", nil},
			{"POST", "/transaction", `[{"op":"set","key":"a","value":2}]`},
			{"DELETE", "", nil},
		} {
			cases = append(cases, refusal{
				name: k.name + "/" + rt.method + rt.rest, method: rt.method, path: o + rt.rest, body: rt.body,
				hdr: idemHdr(k.key), status: http.StatusBadRequest, code: "bad_request",
			})
		}
	}
	runRefusals(t, ts, "order", "o1", cases)
	wantSnap(t, ts, "order", "o1", 1, map[string]string{"a": "1", "n": "1", "l": "[]"})

	// 128 bytes is allowed.
	k128 := strings.Repeat("k", 128)
	wantJSON(t, ts.do("PUT", o+"/a", `{"value":2}`, idemHdr(k128)), http.StatusOK, `{"log_id":2}`)
	wantJSON(t, ts.do("PUT", o+"/a", `{"value":2}`, idemHdr(k128)), http.StatusOK, `{"log_id":2}`)
	wantSnap(t, ts, "order", "o1", 2, map[string]string{"a": "2", "n": "1", "l": "[]"})
}

// TestObjects_IdempotentRetry: a retry with the same key and request returns the
// first reply and writes nothing, on every write route.
func TestObjects_IdempotentRetry(t *testing.T) {
	ts := newTestServer(t, cluster.Config{})
	o := objPath("order", "o1")
	mustDo(t, ts, "PATCH", o, `{"a":1,"n":10,"l":[],"gone":1}`, http.StatusOK) // 1
	cases := []struct {
		name, method, path, body, reply string
	}{
		{"put", "PUT", o + "/a", `{"value":2}`, `{"log_id":2}`},
		{"increment", "POST", o + "/n/increment", `{"by":5}`, `{"log_id":3,"value":15}`},
		{"increment by default", "POST", o + "/n/increment", ``, `{"log_id":4,"value":16}`},
		{"float increment", "POST", o + "/f/increment", `{"by":1.5}`, `{"log_id":5,"value":1.5}`},
		{"append", "POST", o + "/l/append", `{"value":"x"}`, `{"log_id":6}`},
		{"delete", "DELETE", o + "/gone", ``, `{"log_id":7}`},
		{"patch", "PATCH", o, `{"b":1,"a":null}`, `{"log_id":8}`},
		{"transaction", "POST", o + "/transaction", `[{"op":"increment","key":"n","by":100},{"op":"append","key":"l","value":1}]`, `{"log_id":9}`},
	}
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			defer ts.bind(t)()
			key := "key-" + c.name
			var body any
			if c.body != "" {
				body = c.body
			}
			wantJSON(t, ts.do(c.method, c.path, body, idemHdr(key)), http.StatusOK, c.reply)
			after := snapOf(t, ts, "order", "o1")
			if after.logID != uint64(i+2) {
				t.Fatalf("log_id %d after the first request, want %d", after.logID, i+2)
			}
			for retry := 0; retry < 3; retry++ {
				wantJSON(t, ts.do(c.method, c.path, body, idemHdr(key)), http.StatusOK, c.reply)
				wantUnchanged(t, ts, "order", "o1", after)
			}
		})
	}
	wantSnap(t, ts, "order", "o1", 9, map[string]string{"n": "116", "f": "1.5", "l": `["x",1]`, "b": "1"})

	// A retry after later writes still gets the first reply and changes nothing.
	wantJSON(t, ts.do("POST", o+"/n/increment", `{"by":5}`, idemHdr("key-increment")), http.StatusOK, `{"log_id":3,"value":15}`)
	wantJSON(t, ts.do("PUT", o+"/a", `{"value":2}`, idemHdr("key-put")), http.StatusOK, `{"log_id":2}`)
	wantSnap(t, ts, "order", "o1", 9, map[string]string{"n": "116", "f": "1.5", "l": `["x",1]`, "b": "1"})
	items := logPage(t, ts.do("GET", o+"/log?after=1", nil, nil))
	if len(items) != 10 || items[len(items)-1].LogID != 9 {
		t.Fatalf("log after the retries: %+v", items)
	}

	// Requests without a key are never retries.
	wantJSON(t, ts.do("PUT", o+"/a", `{"value":2}`, nil), http.StatusOK, `{"log_id":10}`)
	wantJSON(t, ts.do("PUT", o+"/a", `{"value":2}`, nil), http.StatusOK, `{"log_id":11}`)
}

func TestObjects_IdempotentPurge(t *testing.T) {
	ts := newTestServer(t, cluster.Config{})
	o := objPath("order", "o1")
	mustDo(t, ts, "PATCH", o, `{"a":1}`, http.StatusOK)
	wantNoContent(t, ts.do("DELETE", o, nil, idemHdr("purge-1")))
	wantSnap(t, ts, "order", "o1", 2, nil)
	wantNoContent(t, ts.do("DELETE", o, nil, idemHdr("purge-1")))
	wantSnap(t, ts, "order", "o1", 2, nil)
	mustDo(t, ts, "PUT", o+"/b", `{"value":1}`, http.StatusOK)
	wantNoContent(t, ts.do("DELETE", o, nil, idemHdr("purge-1")))
	wantSnap(t, ts, "order", "o1", 3, map[string]string{"b": "1"})
}

// TestObjects_IdempotencyKeyReused: the same key with a different request on the
// same object is refused with 422 and writes nothing.
func TestObjects_IdempotencyKeyReused(t *testing.T) {
	ts := newTestServer(t, cluster.Config{})
	o := objPath("order", "o1")
	mustDo(t, ts, "PATCH", o, `{"a":1,"n":1,"l":[],"s":1}`, http.StatusOK) // 1
	firsts := []struct {
		key, method, path, body string
	}{
		{"k-put", "PUT", o + "/a", `{"value":2}`},                              // 2
		{"k-inc", "POST", o + "/n/increment", `{"by":1}`},                      // 3
		{"k-append", "POST", o + "/l/append", `{"value":[1]}`},                 // 4
		{"k-delete", "DELETE", o + "/s", ``},                                   // 5
		{"k-patch", "PATCH", o, `{"p":1}`},                                     // 6
		{"k-tx", "POST", o + "/transaction", `[{"op":"increment","key":"n"}]`}, // 7
		{"k-put-x", "PUT", o + "/x", `{"value":[1]}`},                          // 8
		{"k-purge", "DELETE", objPath("order", "o2"), ``},                      // o2: 1
	}
	for _, f := range firsts {
		var body any
		if f.body != "" {
			body = f.body
		}
		if r := ts.do(f.method, f.path, body, idemHdr(f.key)); r.status/100 != 2 {
			t.Fatalf("%s %s: %d %s", f.method, f.path, r.status, r.body)
		}
	}
	want := map[string]string{"a": "2", "n": "3", "l": "[[1]]", "p": "1", "x": "[1]"}
	wantSnap(t, ts, "order", "o1", 8, want)

	h := idemHdr
	runRefusals(t, ts, "order", "o1", []refusal{
		{name: "put other value", method: "PUT", path: o + "/a", body: `{"value":3}`, hdr: h("k-put"), status: 422, code: "invalid"},
		{name: "put other slot", method: "PUT", path: o + "/b", body: `{"value":2}`, hdr: h("k-put"), status: 422, code: "invalid"},
		{name: "increment other by", method: "POST", path: o + "/n/increment", body: `{"by":2}`, hdr: h("k-inc"), status: 422, code: "invalid"},
		{name: "increment other slot", method: "POST", path: o + "/m/increment", body: `{"by":1}`, hdr: h("k-inc"), status: 422, code: "invalid"},
		{name: "append other value", method: "POST", path: o + "/l/append", body: `{"value":[2]}`, hdr: h("k-append"), status: 422, code: "invalid"},
		{name: "delete other slot", method: "DELETE", path: o + "/a", hdr: h("k-delete"), status: 422, code: "invalid"},
		{name: "patch other body", method: "PATCH", path: o, body: `{"p":2}`, hdr: h("k-patch"), status: 422, code: "invalid"},
		{name: "transaction other ops", method: "POST", path: o + "/transaction", body: `[{"op":"increment","key":"n","by":2}]`, hdr: h("k-tx"), status: 422, code: "invalid"},
		// Same key, other route.
		{name: "put key on append", method: "POST", path: o + "/x/append", body: `{"value":[1]}`, hdr: h("k-put-x"), status: 422, code: "invalid"},
		{name: "append key on put", method: "PUT", path: o + "/l", body: `{"value":[1]}`, hdr: h("k-append"), status: 422, code: "invalid"},
		{name: "increment key on transaction", method: "POST", path: o + "/transaction", body: `[{"op":"increment","key":"n","by":1}]`, hdr: h("k-inc"), status: 422, code: "invalid"},
		{name: "transaction key on increment", method: "POST", path: o + "/n/increment", body: ``, hdr: h("k-tx"), status: 422, code: "invalid"},
		{name: "patch key on purge", method: "DELETE", path: o, hdr: h("k-patch"), status: 422, code: "invalid"},
		{name: "put key on patch of the same slot", method: "PATCH", path: o, body: `{"a":2}`, hdr: h("k-put"), status: 422, code: "invalid"},
		{name: "delete key on patch of the same slot", method: "PATCH", path: o, body: `{"s":null}`, hdr: h("k-delete"), status: 422, code: "invalid"},
		{name: "patch key on put of the same slot", method: "PUT", path: o + "/p", body: `{"value":1}`, hdr: h("k-patch"), status: 422, code: "invalid"},
	})
	wantSnap(t, ts, "order", "o1", 8, want)
}

// TestObjects_IdempotencyKeyPerObject: a key is independent on another object.
func TestObjects_IdempotencyKeyPerObject(t *testing.T) {
	ts := newTestServer(t, cluster.Config{})
	other := map[string]string{"X-App-Key": otherApp.Key, "X-App-Secret": otherApp.Secret, "Idempotency-Key": "shared"}
	wantJSON(t, ts.do("POST", objPath("order", "o1", "n", "increment"), `{"by":2}`, idemHdr("shared")), http.StatusOK, `{"log_id":1,"value":2}`)
	// The same request on other objects is a new write.
	wantJSON(t, ts.do("POST", objPath("order", "o2", "n", "increment"), `{"by":2}`, idemHdr("shared")), http.StatusOK, `{"log_id":1,"value":2}`)
	mustDo(t, ts, "PUT", objPath("order", "o3", "n"), `{"value":40}`, http.StatusOK)
	wantJSON(t, ts.do("POST", objPath("order", "o3", "n", "increment"), `{"by":2}`, idemHdr("shared")), http.StatusOK, `{"log_id":2,"value":42}`)
	// A different request on another object is not a conflict.
	wantJSON(t, ts.do("PUT", objPath("order", "o4", "a"), `{"value":"x"}`, idemHdr("shared")), http.StatusOK, `{"log_id":1}`)
	wantJSON(t, ts.do("PUT", objPath("cart", "o1", "a"), `{"value":"y"}`, idemHdr("shared")), http.StatusOK, `{"log_id":1}`)
	// Another app's object of the same type and key.
	wantJSON(t, ts.do("PUT", appObjPath(otherApp.ID, "order", "o1", "a"), `{"value":"z"}`, other), http.StatusOK, `{"log_id":1}`)

	wantSnap(t, ts, "order", "o1", 1, map[string]string{"n": "2"})
	wantSnap(t, ts, "order", "o2", 1, map[string]string{"n": "2"})
	wantSnap(t, ts, "order", "o3", 2, map[string]string{"n": "42"})
	wantSnap(t, ts, "order", "o4", 1, map[string]string{"a": `"x"`})
	wantSnap(t, ts, "cart", "o1", 1, map[string]string{"a": `"y"`})
	if s := stateOf(t, ts, otherApp.ID, "order", "o1"); s.logID != 1 || s.state["a"] != `"z"` {
		t.Fatalf("the other app's order/o1 is %v", s)
	}
	// And each object still answers a retry with its own first reply.
	wantJSON(t, ts.do("POST", objPath("order", "o3", "n", "increment"), `{"by":2}`, idemHdr("shared")), http.StatusOK, `{"log_id":2,"value":42}`)
	wantJSON(t, ts.do("POST", objPath("order", "o1", "n", "increment"), `{"by":2}`, idemHdr("shared")), http.StatusOK, `{"log_id":1,"value":2}`)
	wantSnap(t, ts, "order", "o3", 2, map[string]string{"n": "42"})
	wantSnap(t, ts, "order", "o1", 1, map[string]string{"n": "2"})
}

// TestObjects_IdempotentNoOp: a write that changes nothing, sent with a key,
// still writes nothing (log_id unchanged) and its retry gets the same reply.
func TestObjects_IdempotentNoOp(t *testing.T) {
	ts := newTestServer(t, cluster.Config{})
	o := objPath("order", "o1")
	mustDo(t, ts, "PUT", o+"/a", `{"value":1}`, http.StatusOK) // 1
	cases := []struct{ name, method, path, body string }{
		{"delete missing slot", "DELETE", o + "/missing", ""},
		{"empty patch", "PATCH", o, `{}`},
		{"patch deleting a missing slot", "PATCH", o, `{"missing":null}`},
		{"transaction changing nothing", "POST", o + "/transaction", `[{"op":"set","key":"t","value":1},{"op":"delete","key":"t"}]`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			defer ts.bind(t)()
			var body any
			if c.body != "" {
				body = c.body
			}
			for try := 0; try < 2; try++ {
				wantJSON(t, ts.do(c.method, c.path, body, idemHdr("noop-"+c.name)), http.StatusOK, `{"log_id":1}`)
				wantSnap(t, ts, "order", "o1", 1, map[string]string{"a": "1"})
			}
		})
	}
	// The next real write gets the next log_id, and the log has no gap.
	wantJSON(t, ts.do("PUT", o+"/b", `{"value":2}`, nil), http.StatusOK, `{"log_id":2}`)
	wantJSON(t, ts.do("GET", o+"/log", nil, nil), http.StatusOK,
		`{"items":[{"key":"a","value":1,"log_id":1},{"key":"b","value":2,"log_id":2}]}`)
	// On an object never written.
	wantJSON(t, ts.do("DELETE", objPath("order", "fresh", "x"), nil, idemHdr("noop-fresh")), http.StatusOK, `{"log_id":0}`)
	wantSnap(t, ts, "order", "fresh", 0, nil)
}

// TestObjects_IdempotencyRefusedFirstTry: a request refused with 4xx records no
// reply, so the key can be used again for a valid request.
func TestObjects_IdempotencyRefusedFirstTry(t *testing.T) {
	ts := newTestServer(t, cluster.Config{})
	o := objPath("order", "o1")
	mustDo(t, ts, "PUT", o+"/s", `{"value":"text"}`, http.StatusOK) // 1
	wantError(t, ts.do("POST", o+"/s/increment", ``, idemHdr("k")), http.StatusUnprocessableEntity, "invalid", nil)
	wantSnap(t, ts, "order", "o1", 1, map[string]string{"s": `"text"`})
	wantJSON(t, ts.do("POST", o+"/n/increment", ``, idemHdr("k")), http.StatusOK, `{"log_id":2,"value":1}`)
	wantJSON(t, ts.do("POST", o+"/n/increment", ``, idemHdr("k")), http.StatusOK, `{"log_id":2,"value":1}`)
	wantSnap(t, ts, "order", "o1", 2, map[string]string{"s": `"text"`, "n": "1"})
}

// TestObjects_IdempotentNoOpRestart: the log_id a client reads never goes back
// across a restart, also after a no-op write sent with a key.
func TestObjects_IdempotentNoOpRestart(t *testing.T) {
	cfg := cluster.Config{DataDir: t.TempDir()}
	ts, stop := startStoppable(t, cfg)
	o := objPath("order", "o1")
	mustDo(t, ts, "PUT", o+"/a", `{"value":1}`, http.StatusOK)
	wantJSON(t, ts.do("DELETE", o+"/missing", nil, idemHdr("k")), http.StatusOK, `{"log_id":1}`)
	before := logIDOf(t, ts.do("GET", o, nil, nil))
	stop()
	ts, _ = startStoppable(t, cfg)
	after := logIDOf(t, ts.do("GET", o, nil, nil))
	if after < before {
		t.Fatalf("GET / read log_id %d before the restart and %d after", before, after)
	}
	wantJSON(t, ts.do("DELETE", o+"/missing", nil, idemHdr("k")), http.StatusOK, `{"log_id":1}`)
	wantSnap(t, ts, "order", "o1", 1, map[string]string{"a": "1"})
}
