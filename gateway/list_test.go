package gateway

import (
	"encoding/json"
	"fmt"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/holdfast/holdfast/cluster"
)

// listAll pages through a listing (limit per page) and returns every key
// and the pages it took.
func (ts *testServer) listAll(path, prefix string, limit int) ([]string, int) {
	ts.t.Helper()
	var keys []string
	after := ""
	for pages := 1; ; pages++ {
		q := url.Values{"limit": {fmt.Sprint(limit)}}
		if prefix != "" {
			q.Set("prefix", prefix)
		}
		if after != "" {
			q.Set("after", after)
		}
		r := ts.do("GET", path+"?"+q.Encode(), nil, nil)
		if r.status != 200 {
			ts.t.Fatalf("GET %s?%s: %d %s", path, q.Encode(), r.status, r.body)
		}
		var page struct {
			Keys []string `json:"keys"`
			Next *string  `json:"next"`
		}
		if err := json.Unmarshal(r.body, &page); err != nil || page.Keys == nil {
			ts.t.Fatalf("GET %s: body %s (%v)", path, r.body, err)
		}
		if len(page.Keys) > limit {
			ts.t.Fatalf("a page of %d keys, limit %d", len(page.Keys), limit)
		}
		keys = append(keys, page.Keys...)
		if page.Next == nil {
			return keys, pages
		}
		if len(page.Keys) == 0 || *page.Next != page.Keys[len(page.Keys)-1] {
			ts.t.Fatalf("next %q after keys %q", *page.Next, page.Keys)
		}
		after = *page.Next
	}
}

// TestList_KeysOfATypeAcrossPartitions: objects of one type, spread over
// every partition, with keys of several lengths, page out in byte order
// (limit, after, next), with a prefix; objects that hold only a log, a
// queue or an alarm are listed, a purged object and one whose only slot was
// deleted are not; logs and queues list only the objects that hold one;
// another app's objects and another type's never show; a bad limit is 400,
// one over 1,000 is taken as 1,000, and credentials are required.
func TestList_KeysOfATypeAcrossPartitions(t *testing.T) {
	ts := newTestServer(t, cluster.Config{Partitions: 8})
	var want []string
	for i := range 40 {
		key := fmt.Sprintf("o%d", i) // o0..o39: lengths 2 and 3, interleaved in byte order
		ts.mustOK(ts.do("PUT", "/api/v1/objects/app_test/order/"+key+"/n", map[string]any{"value": i}, nil))
		want = append(want, key)
	}
	ts.mustOK(ts.do("PUT", "/api/v1/objects/app_test/other/o1/n", map[string]any{"value": 1}, nil))
	ts.mustOK(ts.do("PUT", "/api/v1/objects/app_other/order/secret/n", map[string]any{"value": 1}, map[string]string{"X-App-Key": otherApp.Key, "X-App-Secret": otherApp.Secret}))
	// Gone: purged, and a deleted only slot (their change logs stay).
	ts.mustOK(ts.do("PUT", "/api/v1/objects/app_test/order/purged/n", map[string]any{"value": 1}, nil))
	ts.mustOK(ts.do("DELETE", "/api/v1/objects/app_test/order/purged", nil, nil))
	ts.mustOK(ts.do("PUT", "/api/v1/objects/app_test/order/emptied/n", map[string]any{"value": 1}, nil))
	ts.mustOK(ts.do("DELETE", "/api/v1/objects/app_test/order/emptied/n", nil, nil))
	// Other behaviours.
	ts.mustOK(ts.do("POST", "/api/v1/logs/app_test/order/log1/append", `{"records":[{"body":1}]}`, nil))
	ts.mustOK(ts.do("POST", "/api/v1/queues/app_test/order/queue1/messages", `{"messages":[{"id":"a","payload":1}]}`, nil))
	at := time.Now().Add(time.Hour).UnixMilli()
	ts.mustOK(ts.do("PUT", "/api/v1/alarms/app_test/order/alarm1/a", fmt.Sprintf(`{"at": %d, "action": {"kind": "trim"}}`, at), nil))
	want = append(want, "log1", "queue1", "alarm1")
	slices.Sort(want)

	for _, limit := range []int{1, 7, 100} {
		got, pages := ts.listAll("/api/v1/objects/app_test/order", "", limit)
		if !slices.Equal(got, want) {
			t.Fatalf("limit %d: listed %q\nwant %q", limit, got, want)
		}
		if wantPages := len(want)/limit + 1; limit > 1 && pages != wantPages && pages != wantPages-1 {
			t.Fatalf("limit %d: %d pages for %d keys", limit, pages, len(want))
		}
	}
	var o1 []string
	for _, k := range want {
		if len(k) >= 2 && k[:2] == "o1" {
			o1 = append(o1, k)
		}
	}
	if got, _ := ts.listAll("/api/v1/objects/app_test/order", "o1", 3); !slices.Equal(got, o1) {
		t.Fatalf("prefix o1: %q, want %q", got, o1)
	}
	if got, _ := ts.listAll("/api/v1/logs/app_test/order", "", 10); !slices.Equal(got, []string{"log1"}) {
		t.Fatalf("logs: %q", got)
	}
	if got, _ := ts.listAll("/api/v1/queues/app_test/order", "", 10); !slices.Equal(got, []string{"queue1"}) {
		t.Fatalf("queues: %q", got)
	}
	if got, _ := ts.listAll("/api/v1/objects/app_test/nothing", "", 10); len(got) != 0 {
		t.Fatalf("a type with no objects: %q", got)
	}
	r := ts.do("GET", "/api/v1/objects/app_test/order?limit=5000", nil, nil)
	if r.status != 200 || len(r.json(t)["keys"].([]any)) != len(want) {
		t.Fatalf("limit 5000: %d %s", r.status, r.body)
	}
	for _, bad := range []string{"limit=0", "limit=-1", "limit=x", "prefix=" + strings.Repeat("p", 257), "after=" + strings.Repeat("a", 257)} {
		wantError(t, ts.do("GET", "/api/v1/objects/app_test/order?"+bad, nil, nil), 400, "bad_request", nil)
	}
	// A type that is not a name is refused as every route refuses it.
	wantError(t, ts.do("GET", "/api/v1/objects/app_test/a:b", nil, nil), 400, "bad_request", nil)
	wantError(t, ts.do("GET", "/api/v1/logs/app_test/a:b?limit=0", nil, nil), 400, "bad_request", nil)
	wantUnauthorized(t, ts.do("GET", "/api/v1/objects/app_test/order", nil, map[string]string{}))
	wantUnauthorized(t, ts.do("GET", "/api/v1/objects/app_other/order", nil, nil))
}

func (ts *testServer) mustOK(r reply) {
	ts.t.Helper()
	if r.status >= 300 {
		ts.t.Fatalf("%d %s", r.status, r.body)
	}
}

// TestList_TypesOfAnApp: GET /api/v1/objects/{app} pages through the app's
// types that hold data, each once though its objects span partitions, not
// another app's.
func TestList_TypesOfAnApp(t *testing.T) {
	ts := newTestServer(t, cluster.Config{Partitions: 8})
	for i := range 20 {
		ts.mustOK(ts.do("PUT", fmt.Sprintf("/api/v1/objects/app_test/order/o%d/n", i), map[string]any{"value": i}, nil))
	}
	ts.mustOK(ts.do("POST", "/api/v1/logs/app_test/events/e1/append", `{"records":[{"body":1}]}`, nil))
	ts.mustOK(ts.do("PUT", "/api/v1/objects/app_other/secret/s/n", map[string]any{"value": 1}, map[string]string{"X-App-Key": otherApp.Key, "X-App-Secret": otherApp.Secret}))
	var got []string
	after := ""
	for range 5 {
		r := ts.do("GET", "/api/v1/objects/app_test?limit=1&after="+url.QueryEscape(after), nil, nil)
		var page struct {
			Types []string `json:"types"`
			Next  *string  `json:"next"`
		}
		if r.status != 200 || json.Unmarshal(r.body, &page) != nil {
			t.Fatalf("%d %s", r.status, r.body)
		}
		got = append(got, page.Types...)
		if page.Next == nil {
			break
		}
		after = *page.Next
	}
	if !slices.Equal(got, []string{"events", "order"}) {
		t.Fatalf("types %q, want events and order", got)
	}
	wantUnauthorized(t, ts.do("GET", "/api/v1/objects/app_other", nil, nil))
}
