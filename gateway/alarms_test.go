package gateway

import (
	"encoding/json"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/holdfast/holdfast/actors"
)

const alarmPath = "/api/v1/alarms/app_test/events/p1"

func TestAlarms_PutGetListDelete(t *testing.T) {
	ts := logServer(t, actors.LogOptions{MaxBatchSize: 100, MaxRecords: 5})
	at := time.Now().Add(time.Hour).UnixMilli()
	r := ts.do("PUT", alarmPath+"/compact", fmt.Sprintf(`{"at": %d, "action": {"kind": "trim"}}`, at), nil)
	wantJSON(t, r, 200, fmt.Sprintf(`{"name":"compact","at":%d,"generation":1}`, at))
	r = ts.do("PUT", alarmPath+"/later", fmt.Sprintf(`{"at": %d, "action": {"kind": "trim"}}`, at+1000), nil)
	wantJSON(t, r, 200, fmt.Sprintf(`{"name":"later","at":%d,"generation":2}`, at+1000))

	r = ts.do("GET", alarmPath+"/compact", nil, nil)
	if r.status != 200 {
		t.Fatalf("get: %d %s", r.status, r.body)
	}
	var info map[string]any
	if err := json.Unmarshal(r.body, &info); err != nil {
		t.Fatal(err)
	}
	for k, want := range map[string]any{"name": "compact", "at": float64(at), "status": "pending", "attempt": float64(0), "lastError": "",
		"action": map[string]any{"kind": "trim"}} {
		if fmt.Sprint(info[k]) != fmt.Sprint(want) {
			t.Errorf("%s = %v, want %v (body %s)", k, info[k], want, r.body)
		}
	}
	if k, _ := info["idempotencyKey"].(string); len(k) != 32 {
		t.Errorf("idempotencyKey %v", info["idempotencyKey"])
	}

	for _, path := range []string{alarmPath, alarmPath + "/"} {
		r = ts.do("GET", path, nil, nil)
		var list struct{ Alarms []actors.AlarmInfo }
		if r.status != 200 || json.Unmarshal(r.body, &list) != nil || len(list.Alarms) != 2 || list.Alarms[0].Name != "compact" || list.Alarms[1].Name != "later" {
			t.Fatalf("list %s: %d %s", path, r.status, r.body)
		}
	}

	if r = ts.do("DELETE", alarmPath+"/compact", nil, nil); r.status != 204 {
		t.Fatalf("delete: %d %s", r.status, r.body)
	}
	wantError(t, ts.do("DELETE", alarmPath+"/compact", nil, nil), 404, "not_found", nil)
	wantError(t, ts.do("GET", alarmPath+"/compact", nil, nil), 404, "not_found", nil)
	wantUnauthorized(t, ts.do("GET", alarmPath, nil, map[string]string{}))
	wantUnauthorized(t, ts.do("PUT", alarmPath+"/x", fmt.Sprintf(`{"at":%d,"action":{"kind":"trim"}}`, at), map[string]string{}))
}

func TestAlarms_Refusals(t *testing.T) {
	ts := logServer(t, actors.LogOptions{MaxBatchSize: 100})
	at := time.Now().Add(time.Hour).UnixMilli()
	for _, c := range []struct {
		name, body string
		status     int
		code       string
	}{
		{"a", `{"action":{"kind":"trim"}}`, 400, "bad_request"},
		{"a", `{"at":"soon","action":{"kind":"trim"}}`, 400, "bad_request"},
		{"a", fmt.Sprintf(`{"at":%d.5,"action":{"kind":"trim"}}`, at), 400, "bad_request"},
		{"a", `{"at":-1,"action":{"kind":"trim"}}`, 400, "bad_request"},
		{"a", fmt.Sprintf(`{"at":%d,"action":{"kind":"trim"},"extra":1}`, at), 400, "bad_request"},
		{"a", fmt.Sprintf(`{"at":%d,"action":{"kind":"nope"}}`, at), 422, "invalid"}, // well-formed, refused
		{"a", fmt.Sprintf(`{"at":%d,"action":"trim"}`, at), 400, "bad_request"},
		{"a", `not json`, 400, "bad_request"},
		{"a", fmt.Sprintf(`{"at":%d,"action":{"kind":"enqueue","topic":"t"}}`, at), 400, "bad_request"},
		{"a", fmt.Sprintf(`{"at":%d}`, at), 422, "invalid"}, // no action, no Go handler
		{"a", fmt.Sprintf(`{"at":%d,"action":null}`, at), 422, "invalid"},
		{actors.TrimAlarm, fmt.Sprintf(`{"at":%d,"action":{"kind":"trim"}}`, at), 422, "invalid"},
	} {
		r := ts.do("PUT", alarmPath+"/"+c.name, c.body, nil)
		if r.status != c.status {
			t.Errorf("PUT %s %s: %d %s, want %d", c.name, c.body, r.status, r.body, c.status)
			continue
		}
		wantError(t, r, c.status, c.code, nil)
	}
	r := ts.do("GET", alarmPath, nil, nil)
	if r.status != 200 || string(r.body) != "{\"alarms\":[]}\n" {
		t.Fatalf("a refused alarm exists: %d %s", r.status, r.body)
	}
}

// An alarm set over HTTP fires on its own and runs the log's trim.
func TestAlarms_TrimActionFires(t *testing.T) {
	ts := logServer(t, actors.LogOptions{MaxBatchSize: 100, MaxRecords: 3})
	for i := range 10 {
		ts.appendRecs(t, logPath, fmt.Sprint(i))
	}
	r := ts.do("PUT", alarmPath+"/compact", fmt.Sprintf(`{"at":%d,"action":{"kind":"trim"}}`, time.Now().Add(50*time.Millisecond).UnixMilli()), nil)
	if r.status != 200 {
		t.Fatalf("put: %d %s", r.status, r.body)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		var b actors.LogBounds
		r = ts.do("GET", logPath+"/bounds", nil, nil)
		if err := json.Unmarshal(r.body, &b); err != nil {
			t.Fatal(err)
		}
		if b.HotOffset == 7 && ts.do("GET", alarmPath+"/compact", nil, nil).status == http.StatusNotFound {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("bounds %+v: the alarm's trim did not run", b)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
