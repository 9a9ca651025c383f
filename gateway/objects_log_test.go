package gateway

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/holdfast/holdfast/actors"
	"github.com/holdfast/holdfast/cluster"
)

func TestObjects_Log(t *testing.T) {
	ts := newTestServer(t, cluster.Config{})
	o := objPath("order", "o1")
	wantJSON(t, ts.do("GET", o+"/log", nil, nil), http.StatusOK, `{"items":[]}`)

	mustDo(t, ts, "PUT", o+"/status", `{"value":"new"}`, http.StatusOK)                // 1
	mustDo(t, ts, "PATCH", o, `{"c":3,"a":1,"b":{"x":[1, 2]}}`, http.StatusOK)         // 2
	mustDo(t, ts, "POST", o+"/n/increment", `{"by":2.5}`, http.StatusOK)               // 3
	mustDo(t, ts, "POST", o+"/l/append", `{"value":null}`, http.StatusOK)              // 4
	mustDo(t, ts, "DELETE", o+"/status", nil, http.StatusOK)                           // 5
	mustDo(t, ts, "POST", o+"/transaction", `[{"op":"set","key":"a","value":2}]`, 200) // 6

	all := []string{
		`{"key":"status","value":"new","log_id":1}`,
		`{"key":"c","value":3,"log_id":2}`,
		`{"key":"a","value":1,"log_id":2}`,
		`{"key":"b","value":{"x":[1,2]},"log_id":2}`,
		`{"key":"n","value":2.5,"log_id":3}`,
		`{"key":"l","value":[null],"log_id":4}`,
		`{"key":"status","value":null,"log_id":5}`,
		`{"key":"a","value":2,"log_id":6}`,
	}
	items := func(its ...string) string { return `{"items":[` + strings.Join(its, ",") + `]}` }
	cases := []struct {
		query string
		want  string
	}{
		{"", items(all...)},
		{"?after=0", items(all...)},
		{"?after=1", items(all[1:]...)},
		{"?after=2", items(all[4:]...)},
		{"?after=5", items(all[7:]...)},
		{"?after=6", items()},
		// limit counts log entries: entry 2's three items come together.
		{"?limit=1", items(all[0])},
		{"?limit=2", items(all[:4]...)},
		{"?after=1&limit=1", items(all[1:4]...)},
		{"?after=1&limit=2", items(all[1:5]...)},
		{"?after=2&limit=3", items(all[4:7]...)},
		{"?after=0&limit=6", items(all...)},
		{"?after=0&limit=10000", items(all...)},
		{"?limit=10001", items(all...)},
		{"?after=3&limit=1000000", items(all[5:]...)},
		{"?limit=1&after=5", items(all[7])},
		{"?after=6&limit=1", items()},
	}
	for _, c := range cases {
		t.Run(c.query, func(t *testing.T) {
			defer ts.bind(t)()
			wantJSON(t, ts.do("GET", o+"/log"+c.query, nil, nil), http.StatusOK, c.want)
		})
	}
	// After a log_id the object never issued: 410 (issue 26).
	for _, q := range []string{"?after=7", "?after=1000000"} {
		if r := ts.do("GET", o+"/log"+q, nil, nil); r.status != http.StatusGone {
			t.Fatalf("%s: %d %s, want 410", q, r.status, r.body)
		}
	}
	// The App Key as path app.
	wantJSON(t, ts.do("GET", appObjPath(testApp.Key, "order", "o1", "log")+"?after=5", nil, nil), http.StatusOK, items(all[7]))
	wantSnap(t, ts, "order", "o1", 6, map[string]string{"c": "3", "a": "2", "b": `{"x":[1,2]}`, "n": "2.5", "l": "[null]"})
}

func TestObjects_LogBadQuery(t *testing.T) {
	ts := newTestServer(t, cluster.Config{})
	o := objPath("order", "o1")
	mustDo(t, ts, "PUT", o+"/a", `{"value":1}`, http.StatusOK)
	for _, q := range []string{
		"after=-1", "after=abc", "after=1.5", "after=1e3", "after=0x1", "after=1,2", "after=%201",
		"limit=0", "limit=-1", "limit=abc", "limit=1.0", "limit=1e3", "limit=00x",
		"after=1&limit=0",
	} {
		t.Run(q, func(t *testing.T) {
			defer ts.bind(t)()
			wantError(t, ts.do("GET", o+"/log?"+q, nil, nil), http.StatusBadRequest, "bad_request", nil)
		})
	}
	wantSnap(t, ts, "order", "o1", 1, map[string]string{"a": "1"})
}

// TestObjects_LogAfterMaxUint64: after = 2^64-1 is beyond the last entry, a
// log_id the object never issued: 410 (issue 26).
func TestObjects_LogAfterMaxUint64(t *testing.T) {
	ts := newTestServer(t, cluster.Config{})
	o := objPath("order", "o1")
	mustDo(t, ts, "GET", o+"/log?after=18446744073709551615", nil, http.StatusGone)
	mustDo(t, ts, "PUT", o+"/a", `{"value":1}`, http.StatusOK)
	mustDo(t, ts, "GET", o+"/log?after=18446744073709551615", nil, http.StatusGone)
	mustDo(t, ts, "GET", o+"/log?after=18446744073709551614&limit=10000", nil, http.StatusGone)
}

// TestObjects_LogHugeQueryNumbers: numbers past uint64 are still non-negative
// integers: a huge after is beyond the last entry, and a huge limit is capped.
func TestObjects_LogHugeQueryNumbers(t *testing.T) {
	ts := newTestServer(t, cluster.Config{})
	o := objPath("order", "o1")
	mustDo(t, ts, "PUT", o+"/a", `{"value":1}`, http.StatusOK)
	mustDo(t, ts, "GET", o+"/log?after=99999999999999999999", nil, http.StatusGone)
	wantJSON(t, ts.do("GET", o+"/log?limit=99999999999999999999", nil, nil), http.StatusOK, `{"items":[{"key":"a","value":1,"log_id":1}]}`)
}

// writeEntries makes n single-slot log entries on object (typ, key) through the
// Go API, from several goroutines so that commits are batched.
func writeEntries(t *testing.T, ts *testServer, typ, key string, n int) {
	t.Helper()
	kv := actors.NewKV(ts.node, actors.ObjectID{App: testApp.ID, Type: typ, Key: key})
	const workers = 512
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			for i := w; i < n; i += workers {
				if _, err := kv.Increment(context.Background(), "n", 1); err != nil {
					errs <- err
					return
				}
			}
		}(w)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}

// logPage decodes a GET /log reply.
func logPage(t *testing.T, r reply) []actors.LogItem {
	t.Helper()
	if r.status != http.StatusOK {
		t.Fatalf("status %d; body %.300s", r.status, r.body)
	}
	var page struct {
		Items []actors.LogItem `json:"items"`
	}
	if err := json.Unmarshal(r.body, &page); err != nil || page.Items == nil {
		t.Fatalf("body %.300s is not a log page: %v", r.body, err)
	}
	return page.Items
}

// wantLogRange checks that items are one item per entry from first to last.
func wantLogRange(t *testing.T, items []actors.LogItem, first, last uint64) {
	t.Helper()
	if uint64(len(items)) != last-first+1 {
		t.Fatalf("%d items, want %d (log_id %d to %d)", len(items), last-first+1, first, last)
	}
	for i, it := range items {
		if it.LogID != first+uint64(i) || it.Key != "n" {
			t.Fatalf("item %d is %+v, want slot n at log_id %d", i, it, first+uint64(i))
		}
	}
}

// TestObjects_LogLimits: the default page is 1,000 entries and a page holds at
// most 10,000, whatever limit asks.
func TestObjects_LogLimits(t *testing.T) {
	ts := newTestServer(t, cluster.Config{TypeOptions: retention("big", 20000)})
	writeEntries(t, ts, "big", "b1", 10001)
	if s := snapOf(t, ts, "big", "b1"); s.logID != 10001 || s.state["n"] != "10001" {
		t.Fatalf("after 10001 increments: %v", s)
	}
	o := objPath("big", "b1", "log")
	wantLogRange(t, logPage(t, ts.do("GET", o, nil, nil)), 1, 1000)
	wantLogRange(t, logPage(t, ts.do("GET", o+"?after=500", nil, nil)), 501, 1500)
	wantLogRange(t, logPage(t, ts.do("GET", o+"?limit=10000", nil, nil)), 1, 10000)
	wantLogRange(t, logPage(t, ts.do("GET", o+"?limit=10001", nil, nil)), 1, 10000)
	wantLogRange(t, logPage(t, ts.do("GET", o+"?limit=1000000&after=0", nil, nil)), 1, 10000)
	wantLogRange(t, logPage(t, ts.do("GET", o+"?after=1&limit=20000", nil, nil)), 2, 10001)
	wantLogRange(t, logPage(t, ts.do("GET", o+"?after=10000&limit=20000", nil, nil)), 10001, 10001)
}

// TestObjects_LogRetention: with retention N, entries fall out of the change log;
// reading below them gets 410 log_truncated.
func TestObjects_LogRetention(t *testing.T) {
	ts := newTestServer(t, cluster.Config{TypeOptions: retention("short", 3)})
	o := objPath("short", "s1")
	for i := 1; i <= 5; i++ {
		mustDo(t, ts, "PUT", o+"/v", `{"value":`+itoa(i)+`}`, http.StatusOK)
	}
	for _, after := range []string{"0", "1"} {
		r := ts.do("GET", o+"/log?after="+after, nil, nil)
		wantError(t, r, http.StatusGone, "log_truncated", map[string]any{"after": after, "oldest_log_id": 3})
	}
	r := ts.do("GET", o+"/log", nil, nil)
	wantError(t, r, http.StatusGone, "log_truncated", map[string]any{"after": 0, "oldest_log_id": 3})
	wantJSON(t, ts.do("GET", o+"/log?after=2", nil, nil), http.StatusOK,
		`{"items":[{"key":"v","value":3,"log_id":3},{"key":"v","value":4,"log_id":4},{"key":"v","value":5,"log_id":5}]}`)
	wantJSON(t, ts.do("GET", o+"/log?after=4", nil, nil), http.StatusOK, `{"items":[{"key":"v","value":5,"log_id":5}]}`)
	wantJSON(t, ts.do("GET", o+"/log?after=5", nil, nil), http.StatusOK, `{"items":[]}`)
	wantJSON(t, ts.do("GET", o+"/log?after=2&limit=1", nil, nil), http.StatusOK, `{"items":[{"key":"v","value":3,"log_id":3}]}`)

	// No-op writes do not move the retained window.
	mustDo(t, ts, "DELETE", o+"/missing", nil, http.StatusOK)
	mustDo(t, ts, "PATCH", o, `{}`, http.StatusOK)
	wantJSON(t, ts.do("GET", o+"/log?after=2", nil, nil), http.StatusOK,
		`{"items":[{"key":"v","value":3,"log_id":3},{"key":"v","value":4,"log_id":4},{"key":"v","value":5,"log_id":5}]}`)

	// One more entry moves it by one.
	mustDo(t, ts, "PATCH", o, `{"v":6,"w":0}`, http.StatusOK)
	wantError(t, ts.do("GET", o+"/log?after=2", nil, nil), http.StatusGone, "log_truncated", map[string]any{"after": 2, "oldest_log_id": 4})
	wantJSON(t, ts.do("GET", o+"/log?after=3", nil, nil), http.StatusOK,
		`{"items":[{"key":"v","value":4,"log_id":4},{"key":"v","value":5,"log_id":5},{"key":"v","value":6,"log_id":6},{"key":"w","value":0,"log_id":6}]}`)

	// Other types keep the default retention.
	for i := 1; i <= 5; i++ {
		mustDo(t, ts, "PUT", objPath("long", "l1", "v"), `{"value":`+itoa(i)+`}`, http.StatusOK)
	}
	if items := logPage(t, ts.do("GET", objPath("long", "l1", "log"), nil, nil)); len(items) != 5 {
		t.Fatalf("type long: %d items, want 5", len(items))
	}
	wantSnap(t, ts, "short", "s1", 6, map[string]string{"v": "6", "w": "0"})
}

// TestObjects_LogRetentionOne keeps one entry.
func TestObjects_LogRetentionOne(t *testing.T) {
	ts := newTestServer(t, cluster.Config{TypeOptions: retention("one", 1)})
	o := objPath("one", "x")
	mustDo(t, ts, "PUT", o+"/v", `{"value":1}`, http.StatusOK)
	wantJSON(t, ts.do("GET", o+"/log?after=0", nil, nil), http.StatusOK, `{"items":[{"key":"v","value":1,"log_id":1}]}`)
	mustDo(t, ts, "PUT", o+"/v", `{"value":2}`, http.StatusOK)
	wantError(t, ts.do("GET", o+"/log?after=0", nil, nil), http.StatusGone, "log_truncated", map[string]any{"after": 0, "oldest_log_id": 2})
	wantJSON(t, ts.do("GET", o+"/log?after=1", nil, nil), http.StatusOK, `{"items":[{"key":"v","value":2,"log_id":2}]}`)
}
