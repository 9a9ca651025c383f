package gateway

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/holdfast/holdfast/cluster"
)

// GET /api/v1/admin/replay shows the caller's app only what the start replay
// did to its own queues (issue 26: it returned node-wide counts to any app).
func TestAdminReplay_IsScopedToTheCallersApp(t *testing.T) {
	dir := t.TempDir()
	first := newTestServerWith(t, cluster.Config{DataDir: dir}, nil)
	first.do("POST", queuePath+"/messages", `{"messages":[{"id":"a","payload":1},{"id":"b","payload":2}]}`, nil)
	if got := first.receive(t, `{"max":2}`); len(got.Messages) != 2 {
		t.Fatalf("received %d messages, want 2", len(got.Messages))
	}
	first.closeNow(t)

	ts := newTestServerWith(t, cluster.Config{DataDir: dir}, nil)
	summary := func(hdr map[string]string) map[string]any {
		var sum map[string]any
		waitFor(t, "the start replay", func() bool {
			r := ts.do("GET", "/api/v1/admin/replay", nil, hdr)
			return r.status == 200 && json.Unmarshal(r.body, &sum) == nil
		})
		return sum
	}
	if sum := summary(nil); sum["recovered"] != float64(2) {
		t.Fatalf("the owner's summary %v: want the 2 deliveries in flight recovered", sum)
	}
	other := map[string]string{"X-App-Key": otherApp.Key, "X-App-Secret": otherApp.Secret}
	if sum := summary(other); sum["recovered"] != float64(0) || sum["delayed"] != float64(0) || len(sum["errors"].([]any)) != 0 {
		t.Fatalf("another app's summary %v: want nothing of app_test's queues", sum)
	}
}

// closeNow stops ts's server and node before the test ends (its cleanup then
// does nothing more), so that a test can start another on the same directory.
func (ts *testServer) closeNow(t *testing.T) {
	t.Helper()
	ts.gw.Close()
	ts.stop()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := ts.node.Close(ctx); err != nil {
		t.Fatal(err)
	}
	ts.closed = true
}
