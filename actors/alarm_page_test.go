package actors

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"
)

func alarmCapOpts(max int) func(string) TypeOptions {
	return func(string) TypeOptions {
		o := DefaultTypeOptions()
		o.Alarms.MaxPerObject = max
		return o
	}
}

var trimActionJSON = json.RawMessage(`{"kind":"trim"}`)

// TestAlarm_CapPerObject: an object holds at most MaxPerObject alarm names; a
// new name over it is ErrAlarmLimit (an ErrInvalid naming the limit and the key
// that raises it), a replacement is always allowed, a delete frees a slot, and
// the count is right after a restart. A turn's own SetAlarm is capped too.
func TestAlarm_CapPerObject(t *testing.T) {
	n := startAlarmNode(t, t.TempDir(), nil, alarmCapOpts(3), nil)
	ctx := context.Background()
	al := n.alarms("capped")
	at := time.Now().Add(time.Hour)
	for _, name := range []string{"x1", "x2"} {
		if _, err := al.Set(ctx, name, at, trimActionJSON); err != nil {
			t.Fatal(err)
		}
	}
	// The third, from inside a turn: at the limit, allowed.
	if _, err := n.host.Request(ctx, ObjectID{App: "app_t", Type: "alarmer", Key: "capped"}, setInTurn{Name: "tick", At: at}); err != nil {
		t.Fatal(err)
	}
	checkLimit := func(err error) {
		t.Helper()
		if !errors.Is(err, ErrAlarmLimit) || !errors.Is(err, ErrInvalid) {
			t.Fatalf("a new name over the cap: %v, want ErrAlarmLimit", err)
		}
		if msg := err.Error(); !strings.Contains(msg, "3 alarms") || !strings.Contains(msg, "types.alarmer.alarms.maxPerObject") {
			t.Fatalf("the message does not name the limit and its key: %q", msg)
		}
	}
	_, err := al.Set(ctx, "x3", at, trimActionJSON)
	checkLimit(err)
	_, err = n.host.Request(ctx, ObjectID{App: "app_t", Type: "alarmer", Key: "capped"}, setInTurn{Name: "tock", At: at})
	checkLimit(err)
	// Replacing a name at the cap works, over the API and in a turn.
	if _, err := al.Set(ctx, "x1", at.Add(time.Minute), trimActionJSON); err != nil {
		t.Fatalf("replace at the cap: %v", err)
	}
	if _, err := n.host.Request(ctx, ObjectID{App: "app_t", Type: "alarmer", Key: "capped"}, setInTurn{Name: "tick", At: at.Add(time.Minute)}); err != nil {
		t.Fatalf("replace in a turn at the cap: %v", err)
	}
	// Another object has its own count.
	if _, err := n.alarms("other").Set(ctx, "x3", at, trimActionJSON); err != nil {
		t.Fatal(err)
	}
	// A delete frees a slot.
	if err := al.Delete(ctx, "x2"); err != nil {
		t.Fatal(err)
	}
	if _, err := al.Set(ctx, "x3", at, trimActionJSON); err != nil {
		t.Fatalf("after a delete: %v", err)
	}
	_, err = al.Set(ctx, "x4", at, trimActionJSON)
	checkLimit(err)
	// After a restart the object counts what it holds (x1, tick, x3).
	n.stop()
	n = startAlarmNode(t, n.dir, nil, alarmCapOpts(3), nil)
	al = n.alarms("capped")
	_, err = al.Set(ctx, "x4", at, trimActionJSON)
	checkLimit(err)
	if err := al.Delete(ctx, "tick"); err != nil {
		t.Fatal(err)
	}
	if _, err := al.Set(ctx, "x4", at, trimActionJSON); err != nil {
		t.Fatalf("after a restart and a delete: %v", err)
	}
	if list, err := al.List(ctx); err != nil || len(list) != 3 {
		t.Fatalf("list = %+v, %v", list, err)
	}
}

// TestAlarm_CapCountsFailedAndNotReserved: a failed occurrence still holds its
// name's slot; the runtime's own names take none.
func TestAlarm_CapCountsFailedAndNotReserved(t *testing.T) {
	opts := func(string) TypeOptions {
		o := DefaultTypeOptions()
		o.Alarms.MaxPerObject, o.Alarms.MaxAttempts = 1, 1
		o.Log.MaxRecords, o.Log.TrimEvery = 1, time.Hour // arms holdfast:trim with the first append
		return o
	}
	clock := newTestClock()
	a := &alarmer{behave: func(*Context, AlarmCall) error { return errors.New("always fails") }}
	n := startAlarmNode(t, t.TempDir(), clock, opts, a)
	ctx := context.Background()
	id := ObjectID{App: "app_t", Type: "alarmer", Key: "f"}
	if _, err := NewLog(n.host, id).Append(ctx, LogInput{Body: json.RawMessage(`1`)}); err != nil {
		t.Fatal(err)
	}
	al := NewAlarms(n.host, id)
	if _, err := al.Get(ctx, TrimAlarm); err != nil {
		t.Fatalf("the automatic trim alarm: %v", err)
	}
	if _, err := n.host.Request(ctx, id, setInTurn{Name: "tick", At: clock.Now()}); err != nil {
		t.Fatalf("the one user alarm beside the runtime's: %v", err)
	}
	n.advance(time.Second)
	deadline := time.Now().Add(10 * time.Second)
	for {
		got, err := al.Get(ctx, "tick")
		if err != nil {
			t.Fatal(err)
		}
		if got.Status == AlarmFailed {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("tick never failed: %+v", got)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if _, err := al.Set(ctx, "other", clock.Now().Add(time.Hour), trimActionJSON); !errors.Is(err, ErrAlarmLimit) {
		t.Fatalf("a failed alarm freed its slot: %v", err)
	}
}

// collectPages follows an object's alarm pages of limit and returns the
// alarms and the page sizes.
func collectPages(t *testing.T, al *Alarms, limit int) ([]AlarmInfo, []int) {
	t.Helper()
	var all []AlarmInfo
	var sizes []int
	after := ""
	for i := 0; ; i++ {
		if i > 10_000 {
			t.Fatal("the pages never end")
		}
		p, err := al.ListPage(context.Background(), after, limit)
		if err != nil {
			t.Fatal(err)
		}
		if len(p.Alarms) == 0 && p.Next != "" {
			t.Fatal("an empty page with a next cursor")
		}
		all = append(all, p.Alarms...)
		sizes = append(sizes, len(p.Alarms))
		if p.Next == "" {
			return all, sizes
		}
		after = p.Next
	}
}

// TestAlarm_ListPages: following the pages lists every alarm exactly once, in
// (at, name) order, never more than the limit a page; no limit is the default
// page; a cursor no page gave is a bad request.
func TestAlarm_ListPages(t *testing.T) {
	n := startAlarmNode(t, t.TempDir(), nil, nil, nil)
	ctx := context.Background()
	al := n.alarms("paged")
	base := time.Now().Add(time.Hour).UnixMilli()
	want := map[string]int64{}
	for i := range 53 {
		// Ties in at (i%7), names whose byte order differs from their numbers.
		name := fmt.Sprintf("a%d", (i*37)%53)
		at := base + int64(i%7)
		want[name] = at
		if _, err := al.Set(ctx, name, time.UnixMilli(at), trimActionJSON); err != nil {
			t.Fatal(err)
		}
	}
	for _, limit := range []int{1, 7, 53, 1000} {
		got, sizes := collectPages(t, al, limit)
		if len(got) != len(want) {
			t.Fatalf("limit %d: %d alarms listed, want %d (pages %v)", limit, len(got), len(want), sizes)
		}
		seen := map[string]bool{}
		for i, a := range got {
			if seen[a.Name] || want[a.Name] != a.At {
				t.Fatalf("limit %d: %s listed twice or with at %d", limit, a.Name, a.At)
			}
			seen[a.Name] = true
			if i > 0 && (got[i-1].At > a.At || got[i-1].At == a.At && got[i-1].Name >= a.Name) {
				t.Fatalf("limit %d: %s/%d listed after %s/%d", limit, a.Name, a.At, got[i-1].Name, got[i-1].At)
			}
		}
		for _, s := range sizes {
			if s > limit {
				t.Fatalf("limit %d: a page of %d", limit, s)
			}
		}
	}
	// No limit: the default page, here all of them, without a cursor.
	if p, err := al.ListPage(ctx, "", 0); err != nil || len(p.Alarms) != 53 || p.Next != "" {
		t.Fatalf("default page: %d alarms, next %q, %v", len(p.Alarms), p.Next, err)
	}
	// A cursor past a deleted alarm still works: paging is by position.
	p, err := al.ListPage(ctx, "", 10)
	if err != nil {
		t.Fatal(err)
	}
	if err := al.Delete(ctx, p.Alarms[9].Name); err != nil {
		t.Fatal(err)
	}
	rest, err := al.ListPage(ctx, p.Next, 1000)
	if err != nil || len(rest.Alarms) != 43 {
		t.Fatalf("after the cursor's alarm was deleted: %d alarms, %v", len(rest.Alarms), err)
	}
	for _, bad := range []string{"%%%", "AAAA", strings.Repeat("A", 400), alarmCursor{at: 0, name: "x"}.String()[:3]} {
		if _, err := al.ListPage(ctx, bad, 10); !errors.Is(err, ErrBadRequest) {
			t.Fatalf("cursor %q: %v, want a bad request", bad, err)
		}
	}
	// An object without alarms: one empty page.
	if p, err := n.alarms("none").ListPage(ctx, "", 0); err != nil || p.Alarms == nil || len(p.Alarms) != 0 || p.Next != "" {
		t.Fatalf("empty object: %+v, %v", p, err)
	}
}

// TestAlarm_ListPageBytes: 40 alarms with 60 KB actions are not one 2.4 MB
// page: a page stops near AlarmPageBytes (never past it by more than one
// alarm), and the pages still list them all.
func TestAlarm_ListPageBytes(t *testing.T) {
	n := startAlarmNode(t, t.TempDir(), nil, nil, nil)
	ctx := context.Background()
	al := n.alarms("big")
	payload := strings.Repeat("x", 60_000)
	action := json.RawMessage(`{"kind":"enqueue","payload":"` + payload + `"}`)
	at := time.Now().Add(time.Hour)
	for i := range 40 {
		if _, err := al.Set(ctx, fmt.Sprintf("big%02d", i), at, action); err != nil {
			t.Fatal(err)
		}
	}
	got, sizes := collectPages(t, al, 0)
	if len(got) != 40 {
		t.Fatalf("%d alarms listed, want 40", len(got))
	}
	if len(sizes) < 3 {
		t.Fatalf("pages %v: 2.4 MB in fewer than 3 pages", sizes)
	}
	// Each page's real JSON is within the bound (plus one alarm).
	after := ""
	for {
		p, err := al.ListPage(ctx, after, 0)
		if err != nil {
			t.Fatal(err)
		}
		b, err := json.Marshal(p)
		if err != nil {
			t.Fatal(err)
		}
		if len(b) > AlarmPageBytes+len(action)+1024 {
			t.Fatalf("a page of %d bytes", len(b))
		}
		if p.Next == "" {
			break
		}
		after = p.Next
	}
}

// TestAlarmJSONSize_Bounds: the estimate is never below encoding/json's size.
func TestAlarmJSONSize_Bounds(t *testing.T) {
	for _, a := range []AlarmInfo{
		{Name: "plain", Status: AlarmPending, IdempotencyKey: strings.Repeat("f", 32), At: 253402300799999, ScheduledTime: 253402300799999, Attempt: 99, Generation: 1 << 62},
		{Name: "<&>\"\\\n\x01\u2028\xff", LastError: strings.Repeat("<\x02", 512), Status: AlarmFailed, Action: json.RawMessage(`{"kind":"enqueue","payload":"<<>>&&"}`)},
	} {
		b, err := json.Marshal(a)
		if err != nil {
			t.Fatal(err)
		}
		if est := alarmJSONSize(&a); est < len(b)+1 { // +1: the comma between alarms
			t.Fatalf("estimate %d for %d bytes of %s", est, len(b), b)
		}
	}
}
