package gateway

import (
	"encoding/json"
	"testing"

	"github.com/holdfast/holdfast/cluster"
)

// TestObjects_LogAfterANeverIssuedLogIDIsGone: GET /log?after=N with N above
// the object's newest log_id is 410 log_truncated (issue 26): a client holding a
// log_id from before a data loss must not get a quiet empty page.
func TestObjects_LogAfterANeverIssuedLogIDIsGone(t *testing.T) {
	ts := newTestServer(t, cluster.Config{})
	base := "/api/v1/objects/app_test/order/o1"
	for i := 1; i <= 3; i++ {
		ts.do("PUT", base+"/s", map[string]any{"value": i}, nil)
	}
	if r := ts.do("GET", base+"/log?after=3", nil, nil); r.status != 200 {
		t.Fatalf("after the newest: %d %s", r.status, r.body)
	}
	r := ts.do("GET", base+"/log?after=1437", nil, nil)
	var body struct {
		Error  string `json:"error"`
		Code   string `json:"code"`
		After  uint64 `json:"after"`
		Oldest uint64 `json:"oldest_log_id"`
	}
	if err := json.Unmarshal(r.body, &body); err != nil || r.status != 410 || body.Code != "log_truncated" || body.After != 1437 || body.Oldest != 1 || body.Error == "" {
		t.Fatalf("after 1437 of an object at 3: %d %s", r.status, r.body)
	}
	// An object that never wrote has issued no log_id either.
	if r := ts.do("GET", "/api/v1/objects/app_test/order/none/log?after=1", nil, nil); r.status != 410 {
		t.Fatalf("after 1 of a new object: %d %s", r.status, r.body)
	}
	if r := ts.do("GET", "/api/v1/objects/app_test/order/none/log", nil, nil); r.status != 200 {
		t.Fatalf("log of a new object: %d %s", r.status, r.body)
	}
}
