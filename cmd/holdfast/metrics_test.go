package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"regexp"
	"runtime"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// scrape reads GET /metrics of the server at url.
func scrape(t *testing.T, url string) map[string]*dto.MetricFamily {
	t.Helper()
	resp, err := http.Get(url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /metrics: %d", resp.StatusCode)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return fams
}

// value sums the family's samples whose labels include every pair of want.
func value(fams map[string]*dto.MetricFamily, name string, want ...string) float64 {
	f := fams[name]
	if f == nil {
		return 0
	}
	sum := 0.0
	for _, m := range f.GetMetric() {
		ok := true
		for i := 0; i+1 < len(want); i += 2 {
			found := false
			for _, l := range m.GetLabel() {
				if l.GetName() == want[i] && l.GetValue() == want[i+1] {
					found = true
				}
			}
			ok = ok && found
		}
		if !ok {
			continue
		}
		switch {
		case m.Counter != nil:
			sum += m.Counter.GetValue()
		case m.Gauge != nil:
			sum += m.Gauge.GetValue()
		case m.Histogram != nil:
			sum += float64(m.Histogram.GetSampleCount())
		}
	}
	return sum
}

// TestMetrics_CountWhatAWorkloadDid scrapes /metrics of a real server after a
// known workload and checks requests, writes and syncs, dead letters, queue
// transitions and active objects against it.
func TestMetrics_CountWhatAWorkloadDid(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a server process")
	}
	cfgFile, dataDir, _ := crashSetup(t, "")
	srv := startServer(t, dataDir, cfgFile)
	ctx := context.Background()
	c := &http.Client{Timeout: 10 * time.Second}
	do := func(method, path string, body any, want int) map[string]any {
		t.Helper()
		st, reply, err := call(ctx, c, method, srv.url+path, body)
		if err != nil || st != want {
			t.Fatalf("%s %s: %d %v %v, want %d", method, path, st, reply, err, want)
		}
		return reply
	}
	before := scrape(t, srv.url)
	if value(before, "holdfast_objects_active") != 0 || value(before, "holdfast_writes_total") != 0 {
		t.Fatalf("a fresh node reports active objects or writes")
	}

	// 12 writes to 4 KV objects, then 3 reads of missing slots.
	for i := range 12 {
		do("PUT", fmt.Sprintf("/api/v1/objects/app_crash/kv/o%d/s", i%4), map[string]any{"value": i}, 200)
	}
	for range 3 {
		do("GET", "/api/v1/objects/app_crash/kv/o0/missing", nil, 404)
	}
	mid := scrape(t, srv.url)
	writes := value(mid, "holdfast_writes_total")
	commits := value(mid, "holdfast_commits_total")
	if writes != 12 {
		t.Fatalf("writes_total %v after 12 PUTs", writes)
	}
	if commits < 1 || commits > 12 || value(mid, "holdfast_sync_seconds") != commits || value(mid, "holdfast_commit_batch_writes") != commits {
		t.Fatalf("commits %v, sync observations %v, batch observations %v for 12 writes", commits,
			value(mid, "holdfast_sync_seconds"), value(mid, "holdfast_commit_batch_writes"))
	}
	if f := mid["holdfast_commit_batch_writes"]; f == nil || f.GetMetric()[0].GetHistogram().GetSampleSum() != 12 {
		t.Fatalf("the commit batches do not add up to 12 writes: %v", f)
	}
	if n := value(mid, "holdfast_http_requests_total", "behaviour", "kv", "code", "200"); n != 12 {
		t.Fatalf("kv 200 requests: %v, want 12", n)
	}
	if n := value(mid, "holdfast_http_requests_total", "behaviour", "kv", "code", "404"); n != 3 {
		t.Fatalf("kv 404 requests: %v, want 3", n)
	}
	if n := value(mid, "holdfast_http_requests_total", "method", "PUT", "route", "/api/v1/objects/{app}/{type}/{key}/{slot}"); n != 12 {
		t.Fatalf("requests of the PUT route: %v", n)
	}
	if n := value(mid, "holdfast_http_requests_total", "method", "GET", "route", "/api/v1/objects/{app}/{type}/{key}/{slot}", "code", "404"); n != 3 {
		t.Fatalf("404s of the GET route: %v", n)
	}
	if n := value(mid, "holdfast_build_info", "goversion", runtime.Version()); n != 1 {
		t.Fatalf("holdfast_build_info with goversion %s: %v, want 1", runtime.Version(), n)
	}
	if n := value(mid, "holdfast_http_request_seconds", "behaviour", "kv"); n != 15 {
		t.Fatalf("kv latency observations: %v, want 15", n)
	}
	if n := value(mid, "holdfast_objects_active"); n != 4 {
		t.Fatalf("active objects: %v, want 4", n)
	}

	// A queue: 4 messages, 3 received; 2 go to dead letters, 1 is acked.
	const q = "/api/v1/queues/app_crash/jobs/q"
	do("POST", q+"/messages", map[string]any{"messages": []map[string]any{{"payload": 1}, {"payload": 2}, {"payload": 3}, {"payload": 4}}}, 200)
	got := do("POST", q+"/receive", map[string]any{"max": 3}, 200)
	msgs := got["messages"].([]any)
	if len(msgs) != 3 {
		t.Fatalf("received %v", got)
	}
	receipt := func(i int) string { return msgs[i].(map[string]any)["receipt"].(string) }
	do("POST", q+"/dead", map[string]any{"receipt": receipt(0), "reason": "bad"}, 200)
	do("POST", q+"/dead", map[string]any{"receipt": receipt(1)}, 200)
	do("POST", q+"/ack", map[string]any{"receipts": []string{receipt(2)}}, 200)
	after := scrape(t, srv.url)
	for event, want := range map[string]float64{"enqueued": 4, "delivered": 3, "dead_lettered": 2, "completed": 1} {
		if n := value(after, "holdfast_queue_messages_total", "event", event); n != want {
			t.Errorf("queue %s: %v, want %d", event, n, int(want))
		}
	}
	// The depth by state: 1 pending, none processing, 1 complete, 2 dead letters.
	if n := value(after, "holdfast_queues"); n != 1 {
		t.Errorf("queues: %v, want 1", n)
	}
	for state, want := range map[string]float64{"pending": 1, "processing": 0, "complete": 1, "failed": 2} {
		if n, ok := after["holdfast_queue_depth"]; !ok || value(after, "holdfast_queue_depth", "state", state) != want {
			t.Errorf("queue depth %s: %v, want %d", state, n, int(want))
		}
	}
	if n := value(after, "holdfast_objects_active"); n != 5 {
		t.Fatalf("active objects: %v, want 5", n)
	}
	if n := value(after, "holdfast_http_requests_total", "behaviour", "queue", "code", "200"); n != 5 {
		t.Fatalf("queue requests: %v, want 5", n)
	}
	// No label carries a key, a slot or a secret.
	for name, f := range after {
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if v := l.GetValue(); strings.Contains(v, "o0") || strings.Contains(v, "missing") || strings.Contains(v, crashAppSecret) || strings.Contains(v, "app_crash") {
					t.Fatalf("%s has label %s=%q", name, l.GetName(), v)
				}
			}
		}
	}

	// A slot value of 1 MiB, the largest, goes to Badger's value log once
	// it is applied, just after the reply.
	do("PUT", "/api/v1/objects/app_crash/kv/big/s", map[string]any{"value": strings.Repeat("x", 1<<20-2)}, 200)
	var last map[string]*dto.MetricFamily
	for deadline := time.Now().Add(10 * time.Second); ; {
		last = scrape(t, srv.url)
		grew := value(last, "holdfast_value_log_bytes") - value(after, "holdfast_value_log_bytes")
		if grew >= 1<<20 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the value log grew by %v bytes with a 1 MiB value", grew)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if _, ok := last["holdfast_value_log_reclaimed_files_total"]; !ok {
		t.Error("holdfast_value_log_reclaimed_files_total is not exported")
	}
}

// TestMetrics_DashboardNamesExportedMetrics: every holdfast_* series the
// Grafana dashboard in docs/ queries is one the node exports, narrowed to the
// dashboard's job and instance variables.
func TestMetrics_DashboardNamesExportedMetrics(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a server process")
	}
	b, err := os.ReadFile("../../docs/grafana-dashboard.json")
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Panels []struct {
			Title   string
			Targets []struct{ Expr string }
		}
	}
	if err := json.Unmarshal(b, &dash); err != nil {
		t.Fatal(err)
	}
	cfgFile, dataDir, _ := crashSetup(t, "")
	srv := startServer(t, dataDir, cfgFile)
	if resp, err := http.Get(srv.url + "/healthz"); err == nil { // one request, so request series exist
		resp.Body.Close()
	}
	fams := scrape(t, srv.url)
	names := regexp.MustCompile(`holdfast_[a-z_]+`)
	n := 0
	for _, p := range dash.Panels {
		for _, tg := range p.Targets {
			for _, name := range names.FindAllString(tg.Expr, -1) {
				n++
				base := name
				for _, suf := range []string{"_bucket", "_sum", "_count"} {
					if f := fams[strings.TrimSuffix(name, suf)]; f != nil && f.GetType() == dto.MetricType_HISTOGRAM {
						base = strings.TrimSuffix(name, suf)
					}
				}
				if fams[base] == nil {
					t.Errorf("panel %q queries %s, which the node does not export", p.Title, name)
				}
			}
			// Every series is narrowed to the dashboard's job and instance.
			for _, m := range names.FindAllStringIndex(tg.Expr, -1) {
				if !strings.HasPrefix(tg.Expr[m[1]:], `{job=~"$job",instance=~"$instance"`) {
					t.Errorf("panel %q queries %s without the job and instance variables", p.Title, tg.Expr[m[0]:m[1]])
				}
			}
		}
	}
	if n < 20 {
		t.Fatalf("only %d metric names in the dashboard", n)
	}
}
