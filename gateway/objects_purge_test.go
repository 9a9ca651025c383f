package gateway

import (
	"encoding/json"
	"net/http"
	"reflect"
	"sort"
	"testing"

	"github.com/holdfast/holdfast/actors"
	"github.com/holdfast/holdfast/cluster"
)

// wantNoContent checks a 204 with an empty body.
func wantNoContent(t *testing.T, r reply) {
	t.Helper()
	if r.status != http.StatusNoContent || len(r.body) != 0 {
		t.Fatalf("status %d body %q, want 204 and no body", r.status, r.body)
	}
}

func TestObjects_Purge(t *testing.T) {
	ts := newTestServer(t, cluster.Config{})
	o := objPath("order", "o1")
	mustDo(t, ts, "PATCH", o, `{"b":1,"a":"x","c":[1]}`, http.StatusOK) // 1
	mustDo(t, ts, "PUT", o+"/d", `{"value":true}`, http.StatusOK)       // 2
	mustDo(t, ts, "DELETE", o+"/d", nil, http.StatusOK)                 // 3

	wantNoContent(t, ts.do("DELETE", o, nil, nil)) // 4
	wantSnap(t, ts, "order", "o1", 4, nil)
	wantJSON(t, ts.do("GET", o, nil, nil), http.StatusOK, `{"state":{},"log_id":4}`)
	for _, s := range []string{"a", "b", "c"} {
		wantError(t, ts.do("GET", o+"/"+s, nil, nil), http.StatusNotFound, "not_found", nil)
	}
	// The log holds only the purge entry: the deleted slots with value null.
	assertItemsAnyOrder(t, logPage(t, ts.do("GET", o+"/log?after=3", nil, nil)),
		`{"key":"a","value":null,"log_id":4}`, `{"key":"b","value":null,"log_id":4}`, `{"key":"c","value":null,"log_id":4}`)
	for _, after := range []string{"0", "2"} {
		wantError(t, ts.do("GET", o+"/log?after="+after, nil, nil), http.StatusGone, "log_truncated",
			map[string]any{"after": after, "oldest_log_id": 4})
	}
	wantJSON(t, ts.do("GET", o+"/log?after=4", nil, nil), http.StatusOK, `{"items":[]}`)

	// log_id goes on from the purge.
	wantJSON(t, ts.do("PUT", o+"/a", `{"value":2}`, nil), http.StatusOK, `{"log_id":5}`)
	wantSnap(t, ts, "order", "o1", 5, map[string]string{"a": "2"})
	items := logPage(t, ts.do("GET", o+"/log?after=3", nil, nil))
	if len(items) != 4 || items[3].LogID != 5 || items[3].Key != "a" || string(items[3].Value) != "2" {
		t.Fatalf("log after the purge and a write: %+v", items)
	}

	// A purge with a trailing slash, and by App Key; an object purged twice.
	wantNoContent(t, ts.do("DELETE", o+"/", nil, nil)) // 6
	wantSnap(t, ts, "order", "o1", 6, nil)
	wantJSON(t, ts.do("GET", o+"/log?after=5", nil, nil), http.StatusOK, `{"items":[{"key":"a","value":null,"log_id":6}]}`)
	wantNoContent(t, ts.do("DELETE", appObjPath(testApp.Key, "order", "o1"), nil, nil)) // 7
	wantSnap(t, ts, "order", "o1", 7, nil)
	wantJSON(t, ts.do("GET", o+"/log?after=6", nil, nil), http.StatusOK, `{"items":[]}`)
	wantError(t, ts.do("GET", o+"/log?after=5", nil, nil), http.StatusGone, "log_truncated", map[string]any{"after": 5, "oldest_log_id": 7})
}

// TestObjects_PurgeEmpty: a purge of an object that never had slots still records
// one entry.
func TestObjects_PurgeEmpty(t *testing.T) {
	ts := newTestServer(t, cluster.Config{})
	o := objPath("order", "never")
	wantNoContent(t, ts.do("DELETE", o, nil, nil))
	wantSnap(t, ts, "order", "never", 1, nil)
	wantJSON(t, ts.do("GET", o, nil, nil), http.StatusOK, `{"state":{},"log_id":1}`)
	wantJSON(t, ts.do("GET", o+"/log?after=0", nil, nil), http.StatusOK, `{"items":[]}`)
	wantNoContent(t, ts.do("DELETE", o, nil, nil))
	wantSnap(t, ts, "order", "never", 2, nil)
	wantJSON(t, ts.do("PUT", o+"/a", `{"value":1}`, nil), http.StatusOK, `{"log_id":3}`)

	// An object whose slots were all deleted.
	e := objPath("order", "emptied")
	mustDo(t, ts, "PUT", e+"/a", `{"value":1}`, http.StatusOK)
	mustDo(t, ts, "DELETE", e+"/a", nil, http.StatusOK)
	wantNoContent(t, ts.do("DELETE", e, nil, nil))
	wantSnap(t, ts, "order", "emptied", 3, nil)
	wantJSON(t, ts.do("GET", e+"/log?after=2", nil, nil), http.StatusOK, `{"items":[]}`)
	wantError(t, ts.do("GET", e+"/log?after=0", nil, nil), http.StatusGone, "log_truncated", map[string]any{"after": 0, "oldest_log_id": 3})
}

// TestObjects_PurgeLeavesOthers: a purge touches only its object.
func TestObjects_PurgeLeavesOthers(t *testing.T) {
	ts := newTestServer(t, cluster.Config{})
	mustDo(t, ts, "PUT", objPath("order", "o1", "a"), `{"value":1}`, http.StatusOK)
	mustDo(t, ts, "PUT", objPath("order", "o2", "a"), `{"value":2}`, http.StatusOK)
	mustDo(t, ts, "PUT", objPath("other", "o1", "a"), `{"value":3}`, http.StatusOK)
	r := ts.do("PUT", appObjPath(otherApp.ID, "order", "o1", "a"), `{"value":4}`, map[string]string{"X-App-Key": otherApp.Key, "X-App-Secret": otherApp.Secret})
	wantJSON(t, r, http.StatusOK, `{"log_id":1}`)

	wantNoContent(t, ts.do("DELETE", objPath("order", "o1"), nil, nil))
	wantSnap(t, ts, "order", "o1", 2, nil)
	wantSnap(t, ts, "order", "o2", 1, map[string]string{"a": "2"})
	wantSnap(t, ts, "other", "o1", 1, map[string]string{"a": "3"})
	if s := stateOf(t, ts, otherApp.ID, "order", "o1"); s.logID != 1 || s.state["a"] != "4" {
		t.Fatalf("the other app's order/o1 is %v", s)
	}
	wantJSON(t, ts.do("GET", objPath("order", "o2", "log"), nil, nil), http.StatusOK, `{"items":[{"key":"a","value":2,"log_id":1}]}`)
}

// TestObjects_Restart: state, log and log_id survive a node restart; log_id never
// goes back, across purges and restarts.
func TestObjects_Restart(t *testing.T) {
	dir := t.TempDir()
	cfg := cluster.Config{DataDir: dir, TypeOptions: retention("short", 2)}
	ts, stop := startStoppable(t, cfg)
	o := objPath("order", "o1")
	mustDo(t, ts, "PATCH", o, `{"a":1,"b":[1]}`, http.StatusOK)          // 1
	mustDo(t, ts, "POST", o+"/n/increment", `{"by":1.5}`, http.StatusOK) // 2
	p := objPath("order", "purged")
	mustDo(t, ts, "PUT", p+"/a", `{"value":1}`, http.StatusOK) // 1
	mustDo(t, ts, "PUT", p+"/b", `{"value":2}`, http.StatusOK) // 2
	wantNoContent(t, ts.do("DELETE", p, nil, nil))             // 3
	s := objPath("short", "s1")
	for i := 1; i <= 4; i++ {
		mustDo(t, ts, "PUT", s+"/v", `{"value":`+itoa(i)+`}`, http.StatusOK)
	}
	stop()

	ts, stop = startStoppable(t, cfg)
	wantJSON(t, ts.do("GET", o, nil, nil), http.StatusOK, `{"state":{"a":1,"b":[1],"n":1.5},"log_id":2}`)
	wantJSON(t, ts.do("GET", o+"/log", nil, nil), http.StatusOK,
		`{"items":[{"key":"a","value":1,"log_id":1},{"key":"b","value":[1],"log_id":1},{"key":"n","value":1.5,"log_id":2}]}`)
	wantJSON(t, ts.do("POST", o+"/n/increment", `{"by":1.5}`, nil), http.StatusOK, `{"log_id":3,"value":3.0}`)

	wantJSON(t, ts.do("GET", p, nil, nil), http.StatusOK, `{"state":{},"log_id":3}`)
	wantError(t, ts.do("GET", p+"/log?after=0", nil, nil), http.StatusGone, "log_truncated", map[string]any{"after": 0, "oldest_log_id": 3})
	assertItemsAnyOrder(t, logPage(t, ts.do("GET", p+"/log?after=2", nil, nil)),
		`{"key":"a","value":null,"log_id":3}`, `{"key":"b","value":null,"log_id":3}`)
	wantJSON(t, ts.do("PUT", p+"/c", `{"value":3}`, nil), http.StatusOK, `{"log_id":4}`)

	wantError(t, ts.do("GET", s+"/log?after=1", nil, nil), http.StatusGone, "log_truncated", map[string]any{"after": 1, "oldest_log_id": 3})
	wantJSON(t, ts.do("GET", s+"/log?after=2", nil, nil), http.StatusOK, `{"items":[{"key":"v","value":3,"log_id":3},{"key":"v","value":4,"log_id":4}]}`)
	mustDo(t, ts, "PUT", s+"/v", `{"value":5}`, http.StatusOK)
	wantError(t, ts.do("GET", s+"/log?after=2", nil, nil), http.StatusGone, "log_truncated", map[string]any{"after": 2, "oldest_log_id": 4})

	// A purge just before a restart, then a second restart.
	wantNoContent(t, ts.do("DELETE", p, nil, nil)) // 5
	stop()
	ts, _ = startStoppable(t, cfg)
	wantSnap(t, ts, "order", "purged", 5, nil)
	wantSnap(t, ts, "order", "o1", 3, map[string]string{"a": "1", "b": "[1]", "n": "3.0"})
	wantSnap(t, ts, "short", "s1", 5, map[string]string{"v": "5"})
	wantJSON(t, ts.do("GET", p+"/log?after=4", nil, nil), http.StatusOK, `{"items":[{"key":"c","value":null,"log_id":5}]}`)
	wantJSON(t, ts.do("PATCH", p, `{"x":1}`, nil), http.StatusOK, `{"log_id":6}`)
}

// assertItemsAnyOrder checks that items are exactly want (JSON log items), in any
// order.
func assertItemsAnyOrder(t *testing.T, items []actors.LogItem, want ...string) {
	t.Helper()
	got := make([]string, len(items))
	for i, it := range items {
		b, err := json.Marshal(it)
		if err != nil {
			t.Fatal(err)
		}
		got[i] = string(b)
	}
	norm := make([]string, len(want))
	for i, w := range want {
		var it actors.LogItem
		if err := json.Unmarshal([]byte(w), &it); err != nil {
			t.Fatalf("bad want %s: %v", w, err)
		}
		b, _ := json.Marshal(it)
		norm[i] = string(b)
	}
	sort.Strings(got)
	sort.Strings(norm)
	if !reflect.DeepEqual(got, norm) {
		t.Fatalf("log items %v, want %v (any order)", got, norm)
	}
}
