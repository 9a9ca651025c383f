package gateway

import (
	"fmt"
	"net/http"
	"runtime"
	"testing"
	"time"

	"github.com/holdfast/holdfast/cluster"
)

// TestObjects_OverMemoryBudgetAnswers503 fills the real heap past 75% of the
// node's memory budget: writes and new activations get 503 `unavailable` with
// retryAfterMs and Retry-After, until the heap is back under it.
func TestObjects_OverMemoryBudgetAnswers503(t *testing.T) {
	const budget = 512 << 20
	ts := newTestServer(t, cluster.Config{MemoryBudget: budget})
	put := func(key string) reply {
		return ts.do("PUT", "/api/v1/objects/app_test/mem/"+key+"/v", map[string]any{"value": 1}, nil)
	}
	if r := put("before"); r.status != http.StatusOK {
		t.Fatalf("PUT under the budget: %d %s", r.status, r.body)
	}
	// Never written, so it costs address space but no memory; the GC counts
	// it as live heap, and as pointer-free it does not scan it.
	ballast := make([]byte, budget)
	runtime.GC()
	deadline := time.Now().Add(10 * time.Second)
	var r reply
	for i := 0; ; i++ {
		if r = put(fmt.Sprint("over", i)); r.status == http.StatusServiceUnavailable || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond) // the governor samples every 100 ms
	}
	if r.status != http.StatusServiceUnavailable {
		t.Fatalf("PUT with the heap over the budget: %d %s, want 503", r.status, r.body)
	}
	b := r.json(t)
	if b["code"] != "unavailable" || b["retryAfterMs"] != float64(500) || r.header.Get("Retry-After") != "1" || b["error"] != "the node is over its memory budget; retry later" {
		t.Fatalf("503 over the budget: %s, Retry-After %q", r.body, r.header.Get("Retry-After"))
	}
	if r := ts.do("GET", "/api/v1/objects/app_test/mem/other", nil, nil); r.status != http.StatusServiceUnavailable {
		t.Fatalf("GET that activates an object over the budget: %d %s, want 503", r.status, r.body)
	}
	runtime.KeepAlive(ballast)
	ballast = nil
	runtime.GC()
	deadline = time.Now().Add(10 * time.Second)
	for r = put("after"); r.status != http.StatusOK && time.Now().Before(deadline); r = put("after") {
		time.Sleep(10 * time.Millisecond)
	}
	if r.status != http.StatusOK {
		t.Fatalf("PUT once the heap is back under the budget: %d %s", r.status, r.body)
	}
}
