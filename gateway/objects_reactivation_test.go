package gateway

import (
	"net/http"
	"testing"
	"time"

	"github.com/holdfast/holdfast/cluster"
)

// waitPassivated polls until the node holds no active object.
func waitPassivated(t *testing.T, ts *testServer) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for ts.node.Stats().ActiveObjects != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("%d objects still active after 10s", ts.node.Stats().ActiveObjects)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// TestObjects_Reactivation: an object passivated between requests comes back with
// its state, log_id, change-log window, size accounting and idempotency records.
func TestObjects_Reactivation(t *testing.T) {
	ts := newTestServer(t, cluster.Config{IdleTimeout: 20 * time.Millisecond, TypeOptions: retention("doc", 3)})
	o := objPath("doc", "d1")
	state := fullObject(t, ts, "doc", "d1") // 3 entries, exactly 16 MiB
	wantJSON(t, ts.do("DELETE", o+"/s15", nil, nil), http.StatusOK, `{"log_id":4}`)
	wantJSON(t, ts.do("POST", o+"/n/increment", ``, idemHdr("k")), http.StatusOK, `{"log_id":5,"value":1}`)
	// Back to exactly 16 MiB.
	wantJSON(t, ts.do("PUT", o+"/s15", `{"value":`+jsonString(maxValue-3-2)+`}`, nil), http.StatusOK, `{"log_id":6}`)
	state["n"], state["s15"] = "1", jsonString(maxValue-3-2)
	waitPassivated(t, ts)

	wantJSON(t, ts.do("GET", o+"/s01", nil, nil), http.StatusOK, `{"value":`+state["s01"]+`}`)
	waitPassivated(t, ts)
	before := snapOf(t, ts, "doc", "d1")
	waitPassivated(t, ts)
	wantError(t, ts.do("PUT", o+"/x", `{"value":1}`, nil), http.StatusRequestEntityTooLarge, "too_large", nil)
	waitPassivated(t, ts)
	wantUnchanged(t, ts, "doc", "d1", before)
	waitPassivated(t, ts)
	wantJSON(t, ts.do("POST", o+"/n/increment", ``, idemHdr("k")), http.StatusOK, `{"log_id":5,"value":1}`)
	waitPassivated(t, ts)
	wantError(t, ts.do("GET", o+"/log?after=2", nil, nil), http.StatusGone, "log_truncated", map[string]any{"after": 2, "oldest_log_id": 4})
	waitPassivated(t, ts)
	items := logPage(t, ts.do("GET", o+"/log?after=3", nil, nil))
	if len(items) != 3 || items[0].LogID != 4 || string(items[0].Value) != "null" ||
		items[1].LogID != 5 || string(items[1].Value) != "1" || items[2].LogID != 6 {
		t.Fatalf("log after=3: %d items", len(items))
	}
	waitPassivated(t, ts)
	wantJSON(t, ts.do("DELETE", o+"/s14", nil, nil), http.StatusOK, `{"log_id":7}`)
	delete(state, "s14")
	waitPassivated(t, ts)
	wantSnap(t, ts, "doc", "d1", 7, state)
	waitPassivated(t, ts)
	wantNoContent(t, ts.do("DELETE", o, nil, nil))
	waitPassivated(t, ts)
	wantJSON(t, ts.do("GET", o, nil, nil), http.StatusOK, `{"state":{},"log_id":8}`)
	waitPassivated(t, ts)
	wantJSON(t, ts.do("PUT", o+"/a", `{"value":1}`, nil), http.StatusOK, `{"log_id":9}`)
}
