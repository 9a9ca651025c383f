package main

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

// TestClient_AlarmListFollowsPages: `alarm list` prints every alarm, even when
// the server splits them into pages (20 alarms with 60 KB actions are over
// the server's 1 MiB page), and --json holds them all in one document.
func TestClient_AlarmListFollowsPages(t *testing.T) {
	srv := startClientServer(t)
	at := time.Now().Add(time.Hour).UnixMilli()
	action := map[string]any{"kind": "enqueue", "payload": strings.Repeat("z", 60_000)}
	for i := range 20 {
		api(t, srv, "PUT", fmt.Sprintf("/api/v1/alarms/app_crash/jobs/paged/a%02d", i), map[string]any{"at": at + int64(i), "action": action})
	}
	page := api(t, srv, "GET", "/api/v1/alarms/app_crash/jobs/paged/", nil)
	if page["next"] == nil {
		t.Fatalf("the server's first page has no next: it holds %d alarms", len(page["alarms"].([]any)))
	}
	lines := strings.Split(strings.TrimSpace(cliOK(t, srv, "alarm", "list", "jobs/paged")), "\n")
	if len(lines) != 20 {
		t.Fatalf("alarm list printed %d lines, want 20", len(lines))
	}
	for i, l := range lines {
		if !strings.HasPrefix(l, fmt.Sprintf("a%02d pending ", i)) {
			t.Fatalf("line %d: %.60s", i, l)
		}
	}
	if all := cliJSON(t, srv, "alarm", "list", "jobs/paged"); len(all["alarms"].([]any)) != 20 || all["next"] != nil {
		t.Fatalf("alarm list --json: %d alarms", len(all["alarms"].([]any)))
	}
	if empty := cliJSON(t, srv, "alarm", "list", "jobs/none"); fmt.Sprint(empty["alarms"]) != "[]" {
		t.Fatalf("empty list --json: %v", empty)
	}
}
