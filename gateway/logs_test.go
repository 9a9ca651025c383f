package gateway

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/holdfast/holdfast/actors"
	"github.com/holdfast/holdfast/cluster"
	"github.com/holdfast/holdfast/cold"
)

const logPath = "/api/v1/logs/app_test/events/p1"

// logServer is a server whose types get the given log options ("events"), and
// the defaults otherwise.
func logServer(t *testing.T, opts actors.LogOptions) *testServer {
	t.Helper()
	return newTestServer(t, cluster.Config{TypeOptions: func(typ string) actors.TypeOptions {
		o := actors.DefaultTypeOptions()
		if typ == "events" {
			o.Log = opts
		}
		return o
	}})
}

type rec struct {
	Body string `json:"-"`
	Key  string
}

// appendRecs appends records given as raw JSON bodies with optional keys
// ("body" or "body|key") and returns the offsets.
func (ts *testServer) appendRecs(t *testing.T, path string, recs ...string) []uint64 {
	t.Helper()
	r := ts.do("POST", path+"/append", appendBodyOf(recs...), nil)
	if r.status != 200 {
		t.Fatalf("append %v: %d %s", recs, r.status, r.body)
	}
	var out struct{ Offsets []uint64 }
	if err := json.Unmarshal(r.body, &out); err != nil {
		t.Fatal(err)
	}
	return out.Offsets
}

func appendBodyOf(recs ...string) string {
	parts := make([]string, len(recs))
	for i, s := range recs {
		body, key, hasKey := strings.Cut(s, "|")
		if hasKey {
			parts[i] = fmt.Sprintf(`{"body":%s,"deduplicationKey":%q}`, body, key)
		} else {
			parts[i] = fmt.Sprintf(`{"body":%s}`, body)
		}
	}
	return `{"records":[` + strings.Join(parts, ",") + `]}`
}

type page struct {
	Records []struct {
		Offset           uint64          `json:"offset"`
		Body             json.RawMessage `json:"body"`
		DeduplicationKey string          `json:"deduplicationKey"`
		AppendedAt       int64           `json:"appendedAt"`
	} `json:"records"`
	NextOffset uint64 `json:"nextOffset"`
	Lag        uint64 `json:"lag"`
}

func (ts *testServer) readLog(t *testing.T, path, query string) page {
	t.Helper()
	r := ts.do("GET", path+"/records"+query, nil, nil)
	if r.status != 200 {
		t.Fatalf("read %s: %d %s", query, r.status, r.body)
	}
	var p page
	if err := json.Unmarshal(r.body, &p); err != nil {
		t.Fatal(err)
	}
	return p
}

func (ts *testServer) bounds(t *testing.T, path string) string {
	t.Helper()
	r := ts.do("GET", path+"/bounds", nil, nil)
	if r.status != 200 {
		t.Fatalf("bounds: %d %s", r.status, r.body)
	}
	return strings.TrimSpace(string(r.body))
}

func TestLog_OffsetsAreContiguousAcrossBatchesInInputOrder(t *testing.T) {
	ts := logServer(t, actors.LogOptions{})
	if got := ts.bounds(t, logPath); got != `{"oldestOffset":0,"hotOffset":0,"nextOffset":0}` {
		t.Fatalf("empty log bounds %s", got)
	}
	if got := ts.appendRecs(t, logPath, `"a"`, `"b"`, `"c"`); fmt.Sprint(got) != "[0 1 2]" {
		t.Fatalf("first batch %v", got)
	}
	if got := ts.appendRecs(t, logPath, `{"x":1}`, `[1,2]`); fmt.Sprint(got) != "[3 4]" {
		t.Fatalf("second batch %v", got)
	}
	if got := ts.bounds(t, logPath); got != `{"oldestOffset":0,"hotOffset":0,"nextOffset":5}` {
		t.Fatalf("bounds %s", got)
	}
	// Bodies come back byte for byte, with a generated unique key where none was given.
	r := ts.do("POST", logPath+"/append", `{"records":[{"body": {"b" : 2,  "a":1.50}}]}`, nil)
	if r.status != 200 || strings.TrimSpace(string(r.body)) != `{"offsets":[5]}` {
		t.Fatalf("append: %d %s", r.status, r.body)
	}
	p := ts.readLog(t, logPath, "?from=0")
	if len(p.Records) != 6 || p.NextOffset != 6 || p.Lag != 0 {
		t.Fatalf("page %+v", p)
	}
	if string(p.Records[5].Body) != `{"b" : 2,  "a":1.50}` {
		t.Fatalf("body %s, want it byte for byte", p.Records[5].Body)
	}
	keys := map[string]bool{}
	for i, rc := range p.Records {
		if rc.Offset != uint64(i) || rc.DeduplicationKey == "" || keys[rc.DeduplicationKey] || rc.AppendedAt < time.Now().Add(-time.Minute).UnixMilli() {
			t.Fatalf("record %d: %+v", i, rc)
		}
		keys[rc.DeduplicationKey] = true
	}
	if string(p.Records[3].Body) != `{"x":1}` {
		t.Fatalf("record 3 %s", p.Records[3].Body)
	}
}

func TestLog_Deduplication(t *testing.T) {
	ts := logServer(t, actors.LogOptions{MaxRecords: 2})
	if got := ts.appendRecs(t, logPath, `1|k1`, `2|k2`); fmt.Sprint(got) != "[0 1]" {
		t.Fatal(got)
	}
	// A hot key returns its offset and writes nothing (the new body is ignored).
	if got := ts.appendRecs(t, logPath, `3|k3`, `99|k1`, `4|k4`); fmt.Sprint(got) != "[2 0 3]" {
		t.Fatalf("batch with a hot duplicate: %v", got)
	}
	// One key twice in a batch: one offset, at both positions.
	if got := ts.appendRecs(t, logPath, `5|k5`, `6|k5`); fmt.Sprint(got) != "[4 4]" {
		t.Fatalf("key repeated in a batch: %v", got)
	}
	// An all-duplicate batch consumes nothing.
	if got := ts.appendRecs(t, logPath, `7|k4`); fmt.Sprint(got) != "[3]" {
		t.Fatal(got)
	}
	p := ts.readLog(t, logPath, "?from=0")
	if len(p.Records) != 5 || string(p.Records[0].Body) != "1" || string(p.Records[4].Body) != "5" {
		t.Fatalf("records %+v", p.Records)
	}
	// A generated key deduplicates too, while its record is hot.
	gen := ts.appendRecs(t, logPath, `"no key"`) // offset 5
	p = ts.readLog(t, logPath, fmt.Sprintf("?from=%d&limit=1", gen[0]))
	genKey := p.Records[0].DeduplicationKey
	if !strings.HasPrefix(genKey, "gen:") {
		t.Fatalf("generated key %q", genKey)
	}
	if got := ts.appendRecs(t, logPath, `"again"|`+genKey); fmt.Sprint(got) != fmt.Sprint(gen) {
		t.Fatalf("re-append with the generated key %s: %v, want %v", genKey, got, gen)
	}
	// A made-up key of the generated shape is an ordinary new key.
	if got := ts.appendRecs(t, logPath, `"forged"|`+genKey[:len(genKey)-1]+"4"); fmt.Sprint(got) != "[6]" {
		t.Fatalf("forged generated key: %v", got)
	}
	// Trimmed keys append anew.
	if r := ts.do("POST", logPath+"/trim", nil, nil); r.status != 200 || strings.TrimSpace(string(r.body)) != `{"removed":5}` {
		t.Fatalf("trim: %d %s", r.status, r.body)
	}
	if got := ts.appendRecs(t, logPath, `8|k1`, `9|`+genKey, `10|k5`); fmt.Sprint(got) != "[7 5 8]" {
		t.Fatalf("trimmed keys k1 and k5, hot generated key: %v", got)
	}
	ts.do("POST", logPath+"/trim", nil, nil) // keeps 7 and 8
	if got := ts.appendRecs(t, logPath, `11|`+genKey); fmt.Sprint(got) != "[9]" {
		t.Fatalf("trimmed generated key: %v", got)
	}
}

func TestLog_DefiniteRejectionsWriteNothing(t *testing.T) {
	ts := logServer(t, actors.LogOptions{MaxBatchSize: 3})
	ts.appendRecs(t, logPath, `"a"`)
	big := `"` + strings.Repeat("x", actors.MaxRecordBody) + `"`
	for _, c := range []struct {
		body   string
		status int
		code   string
	}{
		{`{"records":[]}`, 422, "invalid"},
		{appendBodyOf(`1`, `2`, `3`, `4`), 422, "invalid"},
		{appendBodyOf(`1|ok`, `2|`), 422, "invalid"},
		{appendBodyOf(`1|` + strings.Repeat("k", actors.MaxDedupKey+1)), 422, "invalid"},
		{appendBodyOf(`1`, big), 413, "too_large"},
		{`{"records":[{"deduplicationKey":"k"}]}`, 400, "bad_request"},
		{`{"records":[{"body":1,"deduplicationKey":5}]}`, 400, "bad_request"},
		{`{"records":[{"body":1,"extra":true}]}`, 400, "bad_request"},
		{`{"records":{}}`, 400, "bad_request"},
		{`{}`, 400, "bad_request"},
		{`[]`, 400, "bad_request"},
		{`{"records":[{"body":}]}`, 400, "bad_request"},
	} {
		r := ts.do("POST", logPath+"/append", c.body, nil)
		if r.status != c.status {
			t.Errorf("append %.80s: %d %s, want %d", c.body, r.status, r.body, c.status)
			continue
		}
		if m := r.json(t); m["code"] != c.code {
			t.Errorf("append %.80s: code %v, want %s", c.body, m["code"], c.code)
		}
	}
	if got := ts.bounds(t, logPath); got != `{"oldestOffset":0,"hotOffset":0,"nextOffset":1}` {
		t.Fatalf("bounds after rejections %s", got)
	}
	if got := ts.appendRecs(t, logPath, `"b"`); fmt.Sprint(got) != "[1]" {
		t.Fatalf("offset after rejections %v: one was consumed", got)
	}
	if r := ts.do("POST", logPath+"/append", appendBodyOf(`1`), map[string]string{"X-App-Key": testApp.Key}); r.status != 401 {
		t.Fatalf("append without the secret: %d", r.status)
	}
}

func TestLog_ReadPagingLagAndBounds(t *testing.T) {
	ts := logServer(t, actors.LogOptions{MaxBatchSize: 4})
	for i := 0; i < 3; i++ {
		ts.appendRecs(t, logPath, "1", "2", "3")
	}
	// limit defaults to and is capped at maxBatchSize.
	p := ts.readLog(t, logPath, "")
	if len(p.Records) != 4 || p.NextOffset != 4 || p.Lag != 5 {
		t.Fatalf("default page: %d records, next %d, lag %d", len(p.Records), p.NextOffset, p.Lag)
	}
	p = ts.readLog(t, logPath, "?from=4&limit=100")
	if len(p.Records) != 4 || p.Records[0].Offset != 4 || p.NextOffset != 8 || p.Lag != 1 {
		t.Fatalf("capped page: %+v", p)
	}
	p = ts.readLog(t, logPath, "?from=8&limit=2")
	if len(p.Records) != 1 || p.NextOffset != 9 || p.Lag != 0 {
		t.Fatalf("last page: %+v", p)
	}
	// Past the end: no records, nextOffset max(from, next).
	p = ts.readLog(t, logPath, "?from=9")
	if len(p.Records) != 0 || p.NextOffset != 9 || p.Lag != 0 {
		t.Fatalf("at the end: %+v", p)
	}
	p = ts.readLog(t, logPath, "?from=50")
	if len(p.Records) != 0 || p.NextOffset != 50 || p.Lag != 0 {
		t.Fatalf("beyond the end: %+v", p)
	}
	for _, q := range []string{"?from=-1", "?from=x", "?limit=0", "?limit=-2", "?limit=1.5", "?from="} {
		if r := ts.do("GET", logPath+"/records"+q, nil, nil); r.status != 400 || r.json(t)["code"] != "bad_request" {
			t.Errorf("read %s: %d %s, want 400", q, r.status, r.body)
		}
	}
	// Reading never moves a cursor.
	if r := ts.do("GET", logPath+"/cursors", nil, nil); strings.TrimSpace(string(r.body)) != `{"cursors":{}}` {
		t.Fatalf("cursors after reads: %s", r.body)
	}
}

func TestLog_ReadBelowOldestIs410WithBothOffsets(t *testing.T) {
	ts := logServer(t, actors.LogOptions{MaxRecords: 3})
	ts.appendRecs(t, logPath, "1", "2", "3", "4", "5")
	ts.do("POST", logPath+"/trim", nil, nil)
	if got := ts.bounds(t, logPath); got != `{"oldestOffset":2,"hotOffset":2,"nextOffset":5}` {
		t.Fatalf("bounds %s", got)
	}
	r := ts.do("GET", logPath+"/records?from=1", nil, nil)
	if r.status != 410 {
		t.Fatalf("read below oldest: %d %s", r.status, r.body)
	}
	m := r.json(t)
	if m["code"] != "log_truncated" || m["requestedOffset"] != 1.0 || m["oldestOffset"] != 2.0 || m["error"] == nil {
		t.Fatalf("410 body %s", r.body)
	}
	if p := ts.readLog(t, logPath, "?from=2"); len(p.Records) != 3 || p.Records[0].Offset != 2 {
		t.Fatalf("read at oldest: %+v", p)
	}
}

func TestLog_CursorsCommitForwardOnlyAndLoad(t *testing.T) {
	ts := logServer(t, actors.LogOptions{})
	ts.appendRecs(t, logPath, "1", "2", "3", "4", "5")
	get := func(path string) (int, string) {
		r := ts.do("GET", path, nil, nil)
		return r.status, strings.TrimSpace(string(r.body))
	}
	commit := func(consumer, body string) (int, string) {
		r := ts.do("PUT", logPath+"/cursors/"+consumer, body, nil)
		return r.status, strings.TrimSpace(string(r.body))
	}
	if s, b := get(logPath + "/load"); s != 200 || b != `{"backlog":0}` {
		t.Fatalf("load with no cursor: %d %s", s, b)
	}
	if s, _ := get(logPath + "/cursors/search"); s != 404 {
		t.Fatalf("cursor never committed: %d", s)
	}
	if s, b := commit("search", `{"offset":0}`); s != 200 || b != `{"offset":0}` {
		t.Fatalf("first commit at 0: %d %s", s, b)
	}
	if s, b := commit("search", `{"offset":3}`); s != 200 || b != `{"offset":3}` {
		t.Fatalf("commit 3: %d %s", s, b)
	}
	if s, b := commit("search", `{"offset":2}`); s != 200 || b != `{"offset":3}` {
		t.Fatalf("commit backwards: %d %s, want the cursor unchanged", s, b)
	}
	if s, b := commit("search", `{"offset":3}`); s != 200 || b != `{"offset":3}` {
		t.Fatalf("commit equal: %d %s", s, b)
	}
	if s, b := commit("search", `{"offset":6}`); s != 422 || !strings.Contains(b, `"code":"invalid"`) {
		t.Fatalf("commit beyond nextOffset: %d %s", s, b)
	}
	if s, b := commit("audit", `{"offset":5}`); s != 200 || b != `{"offset":5}` {
		t.Fatalf("commit at nextOffset: %d %s", s, b)
	}
	if s, b := get(logPath + "/cursors/search"); s != 200 || b != `{"offset":3}` {
		t.Fatalf("cursor: %d %s", s, b)
	}
	if s, b := get(logPath + "/cursors"); s != 200 || b != `{"cursors":{"audit":5,"search":3}}` {
		t.Fatalf("cursors: %d %s", s, b)
	}
	if s, b := get(logPath + "/load"); b != `{"backlog":2}` {
		t.Fatalf("load: %d %s", s, b)
	}
	for _, c := range []struct {
		consumer, body string
		status         int
	}{
		{"search", `{"offset":-1}`, 400}, {"search", `{"offset":"3"}`, 400}, {"search", `{}`, 400}, {"search", `{"offset":1.5}`, 400},
		{"%FF", `{"offset":1}`, 400},
		// A name against the rule of names is refused (422).
		{strings.Repeat("c", 257), `{"offset":1}`, 422}, {"a%2Fb", `{"offset":1}`, 422},
	} {
		if s, b := commit(c.consumer, c.body); s != c.status {
			t.Errorf("commit %s %s: %d %s, want %d", c.consumer[:min(len(c.consumer), 10)], c.body, s, b, c.status)
		}
	}
	// Cursors survive a reactivation (state reloaded from disk).
	if s, b := get(logPath + "/cursors"); b != `{"cursors":{"audit":5,"search":3}}` {
		t.Fatalf("cursors after refusals: %d %s", s, b)
	}
}

func TestLog_TrimByCountBytesAndAgeOldestFirstInPasses(t *testing.T) {
	t.Run("count", func(t *testing.T) {
		ts := logServer(t, actors.LogOptions{MaxBatchSize: 3, MaxRecords: 2})
		for i := 0; i < 4; i++ {
			ts.appendRecs(t, logPath, "1", "2", "3") // offsets 0..11
		}
		ts.do("PUT", logPath+"/cursors/slow", `{"offset":0}`, nil) // cursors are ignored
		r := ts.do("POST", logPath+"/trim", nil, nil)
		if strings.TrimSpace(string(r.body)) != `{"removed":10}` { // four passes of at most 3
			t.Fatalf("trim: %d %s", r.status, r.body)
		}
		if got := ts.bounds(t, logPath); got != `{"oldestOffset":10,"hotOffset":10,"nextOffset":12}` {
			t.Fatalf("bounds %s", got)
		}
		if r := ts.do("POST", logPath+"/trim", nil, nil); strings.TrimSpace(string(r.body)) != `{"removed":0}` {
			t.Fatalf("second trim: %s", r.body)
		}
	})
	t.Run("bytes", func(t *testing.T) {
		ts := logServer(t, actors.LogOptions{MaxBatchSize: 2, MaxBytes: 10})
		ts.appendRecs(t, logPath, `"aaaa"`, `"bbbb"`) // 6, 6 bytes
		ts.appendRecs(t, logPath, `"cc"`, `"dddddd"`) // 4, 8 bytes
		r := ts.do("POST", logPath+"/trim", nil, nil)
		if strings.TrimSpace(string(r.body)) != `{"removed":3}` { // 24 -> 18 -> 12 -> 8
			t.Fatalf("trim: %s", r.body)
		}
		p := ts.readLog(t, logPath, "?from=3")
		if len(p.Records) != 1 || string(p.Records[0].Body) != `"dddddd"` {
			t.Fatalf("left %+v", p)
		}
	})
	t.Run("age", func(t *testing.T) {
		ts := logServer(t, actors.LogOptions{MaxBatchSize: 2, MaxAge: 300 * time.Millisecond})
		ts.appendRecs(t, logPath, "1", "2")
		ts.appendRecs(t, logPath, "3")
		time.Sleep(400 * time.Millisecond)
		ts.appendRecs(t, logPath, "4", "5")
		if r := ts.do("POST", logPath+"/trim", nil, nil); strings.TrimSpace(string(r.body)) != `{"removed":3}` {
			t.Fatalf("trim: %s", r.body)
		}
		if got := ts.bounds(t, logPath); got != `{"oldestOffset":3,"hotOffset":3,"nextOffset":5}` {
			t.Fatalf("bounds %s", got)
		}
	})
	t.Run("none configured", func(t *testing.T) {
		ts := logServer(t, actors.LogOptions{})
		ts.appendRecs(t, logPath, "1", "2")
		if r := ts.do("POST", logPath+"/trim", nil, nil); strings.TrimSpace(string(r.body)) != `{"removed":0}` {
			t.Fatalf("trim: %s", r.body)
		}
	})
}

func TestLog_LogsAreSeparatePerObjectAndApp(t *testing.T) {
	ts := logServer(t, actors.LogOptions{})
	ts.appendRecs(t, logPath, "1", "2")
	if got := ts.appendRecs(t, "/api/v1/logs/app_test/events/p2", "1"); fmt.Sprint(got) != "[0]" {
		t.Fatalf("another object's log: %v", got)
	}
	hdr := map[string]string{"X-App-Key": otherApp.Key, "X-App-Secret": otherApp.Secret}
	if r := ts.do("GET", logPath+"/bounds", nil, hdr); r.status != 401 {
		t.Fatalf("another app on this app's path: %d", r.status)
	}
	r := ts.do("GET", "/api/v1/logs/app_other/events/p1/bounds", nil, hdr)
	if strings.TrimSpace(string(r.body)) != `{"oldestOffset":0,"hotOffset":0,"nextOffset":0}` {
		t.Fatalf("another app's log of the same name: %s", r.body)
	}
	// The object's KV state is untouched by its log.
	if st := ts.state("events", "p1"); st.LogID != 0 {
		t.Fatalf("log_id %d", st.LogID)
	}
}

func TestLog_ColdReadsAndForgetColdOverHTTP(t *testing.T) {
	ts := newTestServer(t, cluster.Config{Cold: cold.NewMemory(), TypeOptions: func(typ string) actors.TypeOptions {
		o := actors.DefaultTypeOptions()
		o.Log = actors.LogOptions{MaxBatchSize: 2, MaxRecords: 1, Cold: true}
		return o
	}})
	ts.appendRecs(t, logPath, "0", "1")
	ts.appendRecs(t, logPath, "2", "3")
	if r := ts.do("POST", logPath+"/trim", nil, nil); strings.TrimSpace(string(r.body)) != `{"removed":3}` {
		t.Fatalf("trim: %d %s", r.status, r.body)
	}
	if got := ts.bounds(t, logPath); got != `{"oldestOffset":0,"hotOffset":3,"nextOffset":4}` {
		t.Fatalf("bounds %s", got)
	}
	if p := ts.readLog(t, logPath, "?from=1"); len(p.Records) != 1 || string(p.Records[0].Body) != "1" || p.NextOffset != 2 || p.Lag != 2 {
		t.Fatalf("cold page %+v", p)
	}
	for _, body := range []string{`{}`, `{"before":-1}`, `{"before":"2"}`, `nope`} {
		if r := ts.do("POST", logPath+"/forget-cold", body, nil); r.status != 400 {
			t.Errorf("forget-cold %s: %d", body, r.status)
		}
	}
	r := ts.do("POST", logPath+"/forget-cold", `{"before":2}`, nil)
	if strings.TrimSpace(string(r.body)) != `{"forgotten":1}` {
		t.Fatalf("forget-cold: %d %s", r.status, r.body)
	}
	r = ts.do("GET", logPath+"/records?from=0", nil, nil)
	if m := r.json(t); r.status != 410 || m["oldestOffset"] != 2.0 || m["requestedOffset"] != 0.0 {
		t.Fatalf("read of a forgotten segment: %d %s", r.status, r.body)
	}
}

func TestLog_LeaseRoutes(t *testing.T) {
	ts := newTestServer(t, cluster.Config{TypeOptions: func(typ string) actors.TypeOptions {
		o := actors.DefaultTypeOptions()
		if typ == "events" {
			o.Log = actors.LogOptions{MaxBatchSize: 3, Leases: &actors.LeaseOptions{MaxParallelism: 1, LeaseDuration: time.Minute, MaxAttempts: 1}}
		}
		return o
	}})
	// A type without leases: 409 leases_disabled on every lease route.
	plain := "/api/v1/logs/app_test/plain/p1"
	ts.appendRecs(t, plain, "1")
	for _, c := range []struct{ method, path, body string }{
		{"POST", "/consumers/c/lease", ""}, {"POST", "/consumers/c/ack", `{"batchId":"x"}`},
		{"POST", "/consumers/c/nack", `{"batchId":"x"}`}, {"GET", "/consumers/c/leases", ""}, {"GET", "/consumers/c/dead-letters", ""},
	} {
		r := ts.do(c.method, plain+c.path, c.body, nil)
		if r.status != 409 || r.json(t)["code"] != "leases_disabled" {
			t.Errorf("%s %s without leases: %d %s", c.method, c.path, r.status, r.body)
		}
	}
	ts.appendRecs(t, logPath, `{"a": 1}`, "2", "3")
	ts.appendRecs(t, logPath, "4")
	r := ts.do("POST", logPath+"/consumers/c/lease", `{"limit": 2}`, nil)
	var lease struct {
		BatchID     string `json:"batchId"`
		Consumer    string
		FirstOffset uint64 `json:"firstOffset"`
		LastOffset  uint64 `json:"lastOffset"`
		Attempt     int
		ExpiresAt   int64 `json:"expiresAt"`
		Records     []struct {
			Offset uint64
			Body   json.RawMessage
		}
	}
	if r.status != 200 || json.Unmarshal(r.body, &lease) != nil || lease.FirstOffset != 0 || lease.LastOffset != 1 || lease.Attempt != 1 || lease.Consumer != "c" || len(lease.Records) != 2 || string(lease.Records[0].Body) != `{"a": 1}` || lease.ExpiresAt == 0 {
		t.Fatalf("lease: %d %s", r.status, r.body)
	}
	if r := ts.do("POST", logPath+"/consumers/c/lease", "", nil); r.status != 204 || len(r.body) != 0 {
		t.Fatalf("lease at maxParallelism: %d %s", r.status, r.body)
	}
	r = ts.do("GET", logPath+"/consumers/c/leases", nil, nil)
	if !strings.Contains(string(r.body), `"state":"active"`) || !strings.Contains(string(r.body), lease.BatchID) {
		t.Fatalf("leases: %s", r.body)
	}
	for _, body := range []string{`{}`, `{"batchId":5}`, `nope`} {
		if r := ts.do("POST", logPath+"/consumers/c/ack", body, nil); r.status != 400 {
			t.Errorf("ack %s: %d", body, r.status)
		}
	}
	for _, body := range []string{`{"limit":0}`, `{"limit":-1}`, `{"x":1}`} {
		if r := ts.do("POST", logPath+"/consumers/c/lease", body, nil); r.status != 400 {
			t.Errorf("lease %s: %d", body, r.status)
		}
	}
	if r := ts.do("POST", logPath+"/consumers/c/ack", `{"batchId":"other"}`, nil); r.status != 409 || r.json(t)["code"] != "lease_not_held" {
		t.Fatalf("ack of an unknown batch: %d %s", r.status, r.body)
	}
	// maxAttempts 1: a nacked range is dead-lettered at the next lease.
	if r := ts.do("POST", logPath+"/consumers/c/nack", `{"batchId":"`+lease.BatchID+`"}`, nil); r.status != 200 || strings.TrimSpace(string(r.body)) != `{}` {
		t.Fatalf("nack: %d %s", r.status, r.body)
	}
	r = ts.do("POST", logPath+"/consumers/c/lease", "", nil)
	if r.status != 200 || json.Unmarshal(r.body, &lease) != nil || lease.FirstOffset != 2 || lease.LastOffset != 3 {
		t.Fatalf("lease after the poison range: %d %s", r.status, r.body)
	}
	r = ts.do("POST", logPath+"/consumers/c/ack", `{"batchId":"`+lease.BatchID+`"}`, nil)
	if strings.TrimSpace(string(r.body)) != `{"cursor":4}` {
		t.Fatalf("ack: %d %s", r.status, r.body)
	}
	r = ts.do("GET", logPath+"/consumers/c/dead-letters", nil, nil)
	if r.status != 200 || !strings.Contains(string(r.body), `"firstOffset":0,"lastOffset":1,"attempts":1`) {
		t.Fatalf("dead letters: %d %s", r.status, r.body)
	}
	if r := ts.do("POST", logPath+"/consumers/c/lease", "", nil); r.status != 204 {
		t.Fatalf("lease with nothing left: %d %s", r.status, r.body)
	}
}
