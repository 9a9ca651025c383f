package gateway

import (
	"net/http"
	"reflect"
	"strings"
	"testing"

	"github.com/holdfast/holdfast/cluster"
)

// objectRouteCases lists one request per object route, for auth and isolation tests.
var objectRouteCases = []struct {
	method, rest string
	body         string
}{
	{"GET", "", ""},
	{"GET", "/", ""},
	{"GET", "/a", ""},
	{"GET", "/log", ""},
	{"PUT", "/a", `{"value":2}`},
	{"PATCH", "", `{"a":2}`},
	{"PATCH", "/", `{"a":2}`},
	{"POST", "/n/increment", `{"by":1}`},
	{"POST", "/l/append", `{"value":1}`},
	{"DELETE", "/a", ""},
	{"POST", "/transaction", `[{"op":"set","key":"a","value":2}]`},
	{"DELETE", "", ""},
	{"DELETE", "/", ""},
}

func TestObjects_Unauthorized(t *testing.T) {
	ts := newTestServer(t, cluster.Config{})
	mustDo(t, ts, "PATCH", objPath("order", "o1"), `{"a":1,"n":1,"l":[]}`, http.StatusOK)
	other := map[string]string{"X-App-Key": otherApp.Key, "X-App-Secret": otherApp.Secret}
	r := ts.do("PATCH", appObjPath(otherApp.ID, "order", "o1"), `{"a":"other"}`, other)
	wantJSON(t, r, http.StatusOK, `{"log_id":1}`)

	auths := []struct {
		name string
		app  string // the path's app
		hdr  map[string]string
	}{
		{"no headers", testApp.ID, map[string]string{}},
		{"key only", testApp.ID, map[string]string{"X-App-Key": testApp.Key}},
		{"secret only", testApp.ID, map[string]string{"X-App-Secret": testApp.Secret}},
		{"empty secret", testApp.ID, map[string]string{"X-App-Key": testApp.Key, "X-App-Secret": ""}},
		{"wrong secret", testApp.ID, map[string]string{"X-App-Key": testApp.Key, "X-App-Secret": "sk_wrong"}},
		{"secret with a suffix", testApp.ID, map[string]string{"X-App-Key": testApp.Key, "X-App-Secret": testApp.Secret + "x"}},
		{"secret prefix", testApp.ID, map[string]string{"X-App-Key": testApp.Key, "X-App-Secret": testApp.Secret[:len(testApp.Secret)-1]}},
		{"unknown key", testApp.ID, map[string]string{"X-App-Key": "pk_unknown", "X-App-Secret": testApp.Secret}},
		{"app ID as key", testApp.ID, map[string]string{"X-App-Key": testApp.ID, "X-App-Secret": testApp.Secret}},
		{"other app's secret", testApp.ID, map[string]string{"X-App-Key": testApp.Key, "X-App-Secret": otherApp.Secret}},
		{"other app's key", testApp.ID, map[string]string{"X-App-Key": otherApp.Key, "X-App-Secret": testApp.Secret}},
		{"path names other app by ID", otherApp.ID, authHdr(nil)},
		{"path names other app by key", otherApp.Key, authHdr(nil)},
		{"other app on testApp's path by ID", testApp.ID, other},
		{"other app on testApp's path by key", testApp.Key, other},
		{"unknown path app", "app_unknown", authHdr(nil)},
	}
	for _, a := range auths {
		for _, rt := range objectRouteCases {
			t.Run(a.name+"/"+rt.method+rt.rest, func(t *testing.T) {
				defer ts.bind(t)()
				before := snapOf(t, ts, "order", "o1")
				beforeOther := stateOf(t, ts, otherApp.ID, "order", "o1")
				var body any
				if rt.body != "" {
					body = rt.body
				}
				wantUnauthorized(t, ts.do(rt.method, appObjPath(a.app, "order", "o1")+rt.rest, body, a.hdr))
				wantUnchanged(t, ts, "order", "o1", before)
				if got := stateOf(t, ts, otherApp.ID, "order", "o1"); !reflect.DeepEqual(got, beforeOther) {
					t.Fatalf("the other app's object changed: %v, was %v", got, beforeOther)
				}
			})
		}
	}
	// Auth is checked before the object's name.
	wantUnauthorized(t, ts.do("GET", objPath("a:b", "k"), nil, map[string]string{}))
	wantUnauthorized(t, ts.do("PUT", objPath("order", "o1", "log"), `{"value":1}`, map[string]string{}))
	wantSnap(t, ts, "order", "o1", 1, map[string]string{"a": "1", "n": "1", "l": "[]"})
}

// TestObjects_AppIsolation: the same (type, key) under two apps are two objects,
// and each app reaches only its own.
func TestObjects_AppIsolation(t *testing.T) {
	ts := newTestServer(t, cluster.Config{})
	other := map[string]string{"X-App-Key": otherApp.Key, "X-App-Secret": otherApp.Secret}
	mustDo(t, ts, "PATCH", objPath("order", "o1"), `{"a":"mine","n":1}`, http.StatusOK)
	mustDo(t, ts, "PUT", objPath("order", "o1", "b"), `{"value":1}`, http.StatusOK)

	for _, app := range []string{otherApp.ID, otherApp.Key} {
		wantJSON(t, ts.do("GET", appObjPath(app, "order", "o1"), nil, other), http.StatusOK, `{"state":{},"log_id":0}`)
		wantError(t, ts.do("GET", appObjPath(app, "order", "o1", "a"), nil, other), http.StatusNotFound, "not_found", nil)
		wantJSON(t, ts.do("GET", appObjPath(app, "order", "o1", "log"), nil, other), http.StatusOK, `{"items":[]}`)
	}
	wantJSON(t, ts.do("POST", appObjPath(otherApp.Key, "order", "o1", "n", "increment"), "", other), http.StatusOK, `{"log_id":1,"value":1}`)
	wantJSON(t, ts.do("PUT", appObjPath(otherApp.ID, "order", "o1", "a"), `{"value":"theirs"}`, other), http.StatusOK, `{"log_id":2}`)
	wantJSON(t, ts.do("GET", appObjPath(otherApp.ID, "order", "o1"), nil, other), http.StatusOK, `{"state":{"a":"theirs","n":1},"log_id":2}`)
	wantSnap(t, ts, "order", "o1", 2, map[string]string{"a": `"mine"`, "n": "1", "b": "1"})

	wantNoContent(t, ts.do("DELETE", appObjPath(otherApp.ID, "order", "o1"), nil, other))
	wantSnap(t, ts, "order", "o1", 2, map[string]string{"a": `"mine"`, "n": "1", "b": "1"})
	wantJSON(t, ts.do("GET", objPath("order", "o1", "log"), nil, nil), http.StatusOK,
		`{"items":[{"key":"a","value":"mine","log_id":1},{"key":"n","value":1,"log_id":1},{"key":"b","value":1,"log_id":2}]}`)
	if s := stateOf(t, ts, otherApp.ID, "order", "o1"); s.logID != 3 || len(s.state) != 0 {
		t.Fatalf("the other app's object after its purge: %v", s)
	}
}

func TestObjects_UnknownRoute(t *testing.T) {
	ts := newTestServer(t, cluster.Config{})
	mustDo(t, ts, "PUT", objPath("order", "o1", "a"), `{"value":1}`, http.StatusOK)
	cases := []struct {
		method, path string
		body         any
	}{
		{"GET", "/api/v1/nothing", nil},
		{"GET", "/", nil},
		{"GET", "/api/v1/objects", nil},
		// (GET /api/v1/objects/{app} and /api/v1/objects/{app}/{type}
		// list types and keys, list_test.go; other methods there are 405,
		// below.)
		{"GET", objPath("order", "o1", "a", "b"), nil},
		{"PUT", objPath("order", "o1", "a", "b"), `{"value":2}`},
		{"POST", objPath("order", "o1", "a", "incr"), `{"by":1}`},
		{"POST", objPath("order", "o1", "a", "increment", "x"), `{"by":1}`},
		{"POST", objPath("order", "o1", "a", "append", "x"), `{"value":1}`},
		{"DELETE", objPath("order", "o1", "a", "b"), nil},
		{"GET", objPath("order", "o1", "log", "x"), nil},
		{"POST", objPath("order", "o1", "transaction", "x"), `[]`},
		{"POST", "/api/v2/objects/" + testApp.ID + "/order/o1/a/increment", ""},
	}
	for _, c := range cases {
		t.Run(c.method+" "+c.path, func(t *testing.T) {
			defer ts.bind(t)()
			before := snapOf(t, ts, "order", "o1")
			wantError(t, ts.do(c.method, c.path, c.body, nil), http.StatusNotFound, "not_found", nil)
			wantUnchanged(t, ts, "order", "o1", before)
		})
	}
	wantSnap(t, ts, "order", "o1", 1, map[string]string{"a": "1"})
	if r := ts.do("PUT", "/api/v1/objects/"+testApp.ID+"/order", `{"value":1}`, nil); r.status != http.StatusMethodNotAllowed || r.header.Get("Allow") == "" {
		t.Fatalf("PUT on a type's listing: %d (Allow %q), want 405 with Allow", r.status, r.header.Get("Allow"))
	}
	wantSnap(t, ts, "order", "o1", 1, map[string]string{"a": "1"})
}

func TestObjects_MethodNotAllowed(t *testing.T) {
	ts := newTestServer(t, cluster.Config{})
	mustDo(t, ts, "PATCH", objPath("order", "o1"), `{"a":1,"n":1,"l":[]}`, http.StatusOK)
	o := objPath("order", "o1")
	cases := []struct {
		method, path string
		body         any
		allow        []string // must be listed in Allow
		notAllow     []string // must not be listed
	}{
		{"POST", o, `{"a":2}`, []string{"GET", "PATCH", "DELETE"}, []string{"POST", "PUT"}},
		{"POST", o + "/", `{"a":2}`, []string{"GET", "PATCH", "DELETE"}, []string{"POST", "PUT"}},
		{"PUT", o, `{"a":2}`, []string{"GET", "PATCH", "DELETE"}, []string{"POST", "PUT"}},
		{"PATCH", o + "/a", `{"a":2}`, []string{"GET", "PUT", "DELETE"}, []string{"PATCH", "POST"}},
		{"POST", o + "/a", `{"value":2}`, []string{"GET", "PUT", "DELETE"}, []string{"PATCH", "POST"}},
		{"GET", o + "/n/increment", nil, []string{"POST"}, []string{"GET", "PUT", "DELETE", "PATCH"}},
		{"PUT", o + "/n/increment", `{"by":1}`, []string{"POST"}, []string{"GET", "PUT", "DELETE", "PATCH"}},
		{"DELETE", o + "/n/increment", nil, []string{"POST"}, []string{"GET", "PUT", "DELETE", "PATCH"}},
		{"GET", o + "/l/append", nil, []string{"POST"}, []string{"GET", "PUT", "DELETE", "PATCH"}},
		{"PATCH", o + "/l/append", `{"value":1}`, []string{"POST"}, []string{"GET", "PUT", "DELETE", "PATCH"}},
		{"POST", o + "/log", `{}`, []string{"GET"}, []string{"POST", "PATCH"}},
		{"PATCH", o + "/transaction", `{"a":2}`, []string{"POST"}, []string{"PATCH"}},
	}
	for _, c := range cases {
		t.Run(c.method+" "+strings.TrimPrefix(c.path, o), func(t *testing.T) {
			defer ts.bind(t)()
			before := snapOf(t, ts, "order", "o1")
			r := ts.do(c.method, c.path, c.body, nil)
			wantError(t, r, http.StatusMethodNotAllowed, "method_not_allowed", nil)
			allow := map[string]bool{}
			for _, m := range strings.Split(r.header.Get("Allow"), ",") {
				allow[strings.TrimSpace(m)] = true
			}
			for _, m := range c.allow {
				if !allow[m] {
					t.Errorf("Allow %q lacks %s", r.header.Get("Allow"), m)
				}
			}
			for _, m := range c.notAllow {
				if allow[m] {
					t.Errorf("Allow %q lists %s", r.header.Get("Allow"), m)
				}
			}
			wantUnchanged(t, ts, "order", "o1", before)
		})
	}
	wantSnap(t, ts, "order", "o1", 1, map[string]string{"a": "1", "n": "1", "l": "[]"})
}

func TestObjects_Health(t *testing.T) {
	ts := newTestServer(t, cluster.Config{})
	for _, p := range []string{"/healthz", "/readyz"} {
		for name, hdr := range map[string]map[string]string{
			"no auth":    {},
			"wrong auth": {"X-App-Key": "pk_nobody", "X-App-Secret": "nope"},
			"auth":       authHdr(nil),
		} {
			t.Run(p+"/"+name, func(t *testing.T) {
				defer ts.bind(t)()
				r := ts.do("GET", p, nil, hdr)
				if r.status != http.StatusOK {
					t.Fatalf("status %d; body %s", r.status, r.body)
				}
			})
		}
	}
}
