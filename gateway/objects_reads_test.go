package gateway

import (
	"net/http"
	"strings"
	"testing"

	"github.com/holdfast/holdfast/cluster"
)

func TestObjects_GetNeverWritten(t *testing.T) {
	ts := newTestServer(t, cluster.Config{})
	for _, p := range []string{
		objPath("order", "o1"),
		objPath("order", "o1") + "/",
		appObjPath(testApp.Key, "order", "o1"),
		appObjPath(testApp.Key, "order", "o1") + "/",
	} {
		t.Run(p, func(t *testing.T) {
			defer ts.bind(t)()
			wantJSON(t, ts.do("GET", p, nil, nil), http.StatusOK, `{"state":{},"log_id":0}`)
		})
	}
	// Reading writes nothing.
	wantSnap(t, ts, "order", "o1", 0, nil)
}

func TestObjects_GetStateAndSlot(t *testing.T) {
	ts := newTestServer(t, cluster.Config{})
	mustDo(t, ts, "PATCH", objPath("order", "o1"), `{"status":"shipped","n":2,"tags":["a",null],"obj":{"x":1.50},"f":false}`, http.StatusOK)
	want := `{"state":{"status":"shipped","n":2,"tags":["a",null],"obj":{"x":1.50},"f":false},"log_id":1}`
	wantJSON(t, ts.do("GET", objPath("order", "o1"), nil, nil), http.StatusOK, want)
	wantJSON(t, ts.do("GET", objPath("order", "o1")+"/", nil, nil), http.StatusOK, want)
	wantJSON(t, ts.do("GET", appObjPath(testApp.Key, "order", "o1"), nil, nil), http.StatusOK, want)

	for slot, v := range map[string]string{
		"status": `"shipped"`, "n": `2`, "tags": `["a",null]`, "obj": `{"x":1.50}`, "f": `false`,
	} {
		t.Run(slot, func(t *testing.T) {
			defer ts.bind(t)()
			wantJSON(t, ts.do("GET", objPath("order", "o1", slot), nil, nil), http.StatusOK, `{"value":`+v+`}`)
		})
	}
	for _, slot := range []string{"missing", "Status"} {
		t.Run("404/"+slot, func(t *testing.T) {
			defer ts.bind(t)()
			wantError(t, ts.do("GET", objPath("order", "o1", slot), nil, nil), http.StatusNotFound, "not_found", nil)
		})
	}
	// A name no write takes is refused as the writes refuse it (one rule).
	for _, slot := range []string{"transaction", "a%2Fb", strings.Repeat("s", 257)} {
		t.Run("422/"+slot[:min(len(slot), 20)], func(t *testing.T) {
			defer ts.bind(t)()
			wantError(t, ts.do("GET", objPath("order", "o1", slot), nil, nil), http.StatusUnprocessableEntity, "invalid", nil)
		})
	}
	wantSnap(t, ts, "order", "o1", 1, map[string]string{
		"status": `"shipped"`, "n": `2`, "tags": `["a",null]`, "obj": `{"x":1.50}`, "f": `false`,
	})
}

// TestObjects_ObjectNames covers the naming rules of spec/README.md as seen through
// URL path segments (percent-decoded once).
func TestObjects_ObjectNames(t *testing.T) {
	ts := newTestServer(t, cluster.Config{})
	long := strings.Repeat("t", 256)
	valid := []struct {
		name       string
		typ, key   string // as written in the path
		wTyp, wKey string // as stored
	}{
		{"key with colon", "order", "a:b", "order", "a:b"},
		{"key with escaped colon", "order", "c%3Ad", "order", "c:d"},
		{"decoded once", "order", "a%2520b", "order", "a%20b"},
		{"utf-8", "ordre", "%C3%A9t%C3%A9", "ordre", "été"},
		{"256-byte type and key", long, strings.Repeat("k", 256), long, strings.Repeat("k", 256)},
	}
	for _, c := range valid {
		t.Run("valid/"+c.name, func(t *testing.T) {
			defer ts.bind(t)()
			r := ts.do("PUT", objPath(c.typ, c.key, "s"), `{"value":1}`, nil)
			wantJSON(t, r, http.StatusOK, `{"log_id":1}`)
			wantSnap(t, ts, c.wTyp, c.wKey, 1, map[string]string{"s": "1"})
			wantJSON(t, ts.do("GET", objPath(c.typ, c.key), nil, nil), http.StatusOK, `{"state":{"s":1},"log_id":1}`)
		})
	}

	invalid := []struct{ name, typ, key string }{
		{"type with colon", "a:b", "k"},
		{"type with escaped colon", "a%3Ab", "k"},
		{"type with escaped slash", "a%2Fb", "k"},
		{"key with escaped slash", "order", "a%2Fb"},
		{"key that is only an escaped slash", "order", "%2F"},
		{"key that is an escaped dot", "order", "%2E"},
		{"type that is escaped dots", "%2E%2E", "k"},
		{"type over 256 bytes", strings.Repeat("t", 257), "k"},
		{"key over 256 bytes", "order", strings.Repeat("k", 257)},
		{"type over 256 bytes in UTF-8", strings.Repeat("%C3%A9", 129), "k"},
		{"type not UTF-8", "a%FFb", "k"},
		{"key not UTF-8", "order", "%C3%28"},
	}
	routes := []struct {
		method, rest string
		body         any
	}{
		{"GET", "", nil},
		{"GET", "/", nil},
		{"GET", "/s", nil},
		{"GET", "/log", nil},
		{"PUT", "/s", `{"value":1}`},
		{"PATCH", "", `{"s":1}`},
		{"POST", "/s/increment", ""},
		{"POST", "/s/append", `{"value":1}`},
		{"DELETE", "/s", nil},
		{"POST", "/transaction", `[{"op":"set","key":"s","value":1}]`},
		{"DELETE", "", nil},
	}
	for _, c := range invalid {
		for _, rt := range routes {
			t.Run("invalid/"+c.name+"/"+rt.method+rt.rest, func(t *testing.T) {
				defer ts.bind(t)()
				r := ts.do(rt.method, objPath(c.typ, c.key)+rt.rest, rt.body, nil)
				wantError(t, r, http.StatusBadRequest, "bad_request", nil)
			})
		}
	}
	// The objects that a mis-decoded name could have reached hold nothing.
	for _, o := range [][2]string{{"a", "k"}, {"b", "k"}, {"order", "a"}, {"order", "b"}} {
		wantSnap(t, ts, o[0], o[1], 0, nil)
	}
}

// TestObjects_EmptyNameSegments: an empty type or key (an empty path segment) is a
// name that breaks the rules: 400, and never a request to another object. The
// client here follows redirects, as http.DefaultClient does.
func TestObjects_EmptyNameSegments(t *testing.T) {
	ts := newTestServer(t, cluster.Config{})
	// The object that the paths below name once their empty segment is dropped.
	mustDo(t, ts, "PATCH", objPath("t", "s"), `{"a":1}`, http.StatusOK)
	cases := []struct {
		method, path string
		body         any
	}{
		{"DELETE", objPath("t", "", "s"), nil},            // empty key, slot s
		{"DELETE", objPath("", "t", "s"), nil},            // empty type
		{"GET", objPath("t", "", "s"), nil},               // empty key, slot s
		{"PUT", objPath("t", "", "s"), `{"value":2}`},     // empty key, slot s
		{"PATCH", objPath("", "t", "s") + "/", `{"a":2}`}, // empty type, key t... as a base path
		{"GET", objPath("", "k"), nil},
	}
	for _, c := range cases {
		t.Run(c.method+" "+c.path, func(t *testing.T) {
			defer ts.bind(t)()
			before := snapOf(t, ts, "t", "s")
			r := ts.do(c.method, c.path, c.body, nil)
			if r.status != http.StatusBadRequest {
				t.Errorf("status %d, want 400; body %s", r.status, r.body)
			} else {
				wantError(t, r, http.StatusBadRequest, "bad_request", nil)
			}
			wantUnchanged(t, ts, "t", "s", before)
		})
	}
	wantSnap(t, ts, "t", "s", 1, map[string]string{"a": "1"})
}
