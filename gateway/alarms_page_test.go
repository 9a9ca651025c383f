package gateway

import (
	"encoding/json"
	"fmt"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/holdfast/holdfast/actors"
	"github.com/holdfast/holdfast/cluster"
)

func alarmCapServer(t *testing.T, max int) *testServer {
	t.Helper()
	return newTestServer(t, cluster.Config{TypeOptions: func(string) actors.TypeOptions {
		o := actors.DefaultTypeOptions()
		o.Alarms.MaxPerObject = max
		return o
	}})
}

type alarmPage struct {
	Alarms []actors.AlarmInfo `json:"alarms"`
	Next   *string            `json:"next"`
}

// pagesOf follows the list's pages with query (limit=...) and returns every
// alarm, the pages' sizes and the largest reply in bytes.
func (ts *testServer) pagesOf(t *testing.T, query string) (all []actors.AlarmInfo, sizes []int, largest int) {
	t.Helper()
	after := ""
	for i := 0; ; i++ {
		if i > 1000 {
			t.Fatal("the pages never end")
		}
		q := query
		if after != "" {
			q += "&after=" + url.QueryEscape(after)
		}
		r := ts.do("GET", alarmPath+"/?"+q, nil, nil)
		var p alarmPage
		if r.status != 200 || json.Unmarshal(r.body, &p) != nil {
			t.Fatalf("page %d: %d %s", i, r.status, r.body)
		}
		all = append(all, p.Alarms...)
		sizes = append(sizes, len(p.Alarms))
		largest = max(largest, len(r.body))
		if p.Next == nil {
			return all, sizes, largest
		}
		if *p.Next == "" || len(p.Alarms) == 0 {
			t.Fatalf("page %d: next %q after %d alarms", i, *p.Next, len(p.Alarms))
		}
		after = *p.Next
	}
}

// TestAlarms_ListPagesOverHTTP: limit and after page the list; every alarm is
// listed once, in (at, name) order; "next" is there only when more follow; a
// client without parameters gets the first page; bad parameters are 400.
func TestAlarms_ListPagesOverHTTP(t *testing.T) {
	ts := alarmCapServer(t, 0)
	at := time.Now().Add(time.Hour).UnixMilli()
	for i := range 30 {
		r := ts.do("PUT", fmt.Sprintf("%s/n%02d", alarmPath, (i*7)%30), fmt.Sprintf(`{"at":%d,"action":{"kind":"trim"}}`, at+int64(i%4)), nil)
		if r.status != 200 {
			t.Fatalf("put: %d %s", r.status, r.body)
		}
	}
	all, sizes, _ := ts.pagesOf(t, "limit=7")
	if len(all) != 30 || fmt.Sprint(sizes) != "[7 7 7 7 2]" {
		t.Fatalf("%d alarms in pages %v", len(all), sizes)
	}
	seen := map[string]bool{}
	for i, a := range all {
		if seen[a.Name] {
			t.Fatalf("%s listed twice", a.Name)
		}
		seen[a.Name] = true
		if i > 0 && (all[i-1].At > a.At || all[i-1].At == a.At && all[i-1].Name >= a.Name) {
			t.Fatalf("%s listed after %s", a.Name, all[i-1].Name)
		}
	}
	// No parameters: the first (here the only) page, without "next".
	r := ts.do("GET", alarmPath, nil, nil)
	var p alarmPage
	if r.status != 200 || json.Unmarshal(r.body, &p) != nil || len(p.Alarms) != 30 || p.Next != nil || strings.Contains(string(r.body), `"next"`) {
		t.Fatalf("unpaged list: %d %s", r.status, r.body)
	}
	// A limit over the cap is capped, not refused.
	if r := ts.do("GET", alarmPath+"?limit=1000000", nil, nil); r.status != 200 {
		t.Fatalf("large limit: %d %s", r.status, r.body)
	}
	for _, q := range []string{"limit=0", "limit=-1", "limit=x", "limit=", "limit=1.5", "after=", "after=%25%25", "after=AAAA", "after=" + strings.Repeat("A", 500)} {
		wantError(t, ts.do("GET", alarmPath+"/?"+q, nil, nil), 400, "bad_request", nil)
	}
}

// TestAlarms_ListPageBytesOverHTTP: 40 alarms with 60 KB actions (2.4 MB) come
// in pages of about 1 MiB, never one 2.4 MB reply.
func TestAlarms_ListPageBytesOverHTTP(t *testing.T) {
	ts := alarmCapServer(t, 0)
	at := time.Now().Add(time.Hour).UnixMilli()
	action := `{"kind":"enqueue","payload":"` + strings.Repeat("y", 60_000) + `"}`
	for i := range 40 {
		if r := ts.do("PUT", fmt.Sprintf("%s/big%02d", alarmPath, i), fmt.Sprintf(`{"at":%d,"action":%s}`, at, action), nil); r.status != 200 {
			t.Fatalf("put: %d %s", r.status, r.body)
		}
	}
	all, sizes, largest := ts.pagesOf(t, "")
	if len(all) != 40 || len(sizes) < 3 {
		t.Fatalf("%d alarms in pages %v", len(all), sizes)
	}
	if limit := actors.AlarmPageBytes + len(action) + 1024; largest > limit {
		t.Fatalf("a reply of %d bytes, over %d", largest, limit)
	}
}

// TestAlarms_CapOverHTTP: a new name over the type's maxPerObject is 422
// invalid, naming the limit and the key; replacing a name still works.
func TestAlarms_CapOverHTTP(t *testing.T) {
	ts := alarmCapServer(t, 2)
	body := fmt.Sprintf(`{"at":%d,"action":{"kind":"trim"}}`, time.Now().Add(time.Hour).UnixMilli())
	for _, name := range []string{"a", "b"} {
		if r := ts.do("PUT", alarmPath+"/"+name, body, nil); r.status != 200 {
			t.Fatalf("put %s: %d %s", name, r.status, r.body)
		}
	}
	r := ts.do("PUT", alarmPath+"/c", body, nil)
	wantError(t, r, 422, "invalid", nil)
	if !strings.Contains(string(r.body), "2 alarms") || !strings.Contains(string(r.body), "types.events.alarms.maxPerObject") {
		t.Fatalf("the refusal does not say the limit and how to raise it: %s", r.body)
	}
	if r := ts.do("PUT", alarmPath+"/a", body, nil); r.status != 200 {
		t.Fatalf("replace at the cap: %d %s", r.status, r.body)
	}
	if r := ts.do("GET", alarmPath+"/c", nil, nil); r.status != 404 {
		t.Fatalf("the refused alarm exists: %d %s", r.status, r.body)
	}
}
