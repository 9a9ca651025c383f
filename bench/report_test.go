package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func TestSummarize(t *testing.T) {
	if got := summarize([]float64{5, 1, 3}); got != (stat{Median: 3, Min: 1, Max: 5, N: 3}) {
		t.Fatalf("odd: %+v", got)
	}
	if got := summarize([]float64{4, 1, 3, 2}); got != (stat{Median: 2.5, Min: 1, Max: 4, N: 4}) {
		t.Fatalf("even: %+v", got)
	}
	if got := summarize(nil); got.N != 0 {
		t.Fatalf("empty: %+v", got)
	}
}

// testReport is a report of two rounds of one workload with a probe target
// and a Redis target, Holdfast at hf per second, Redis at redis, the probe at
// probe.
func testReport(t *testing.T, probe, hf, redis, floor float64) (*report, string) {
	t.Helper()
	w := workload{name: "w", title: "w", unit: "writes/s", target: 10, vsRedis: 2, payload: true}
	dir := t.TempDir()
	r := &report{
		cfg: driveConfig{rounds: 2, floor: floor, workloads: []workload{w}, systems: []string{sysHoldfast, sysRedis},
			base: dir, mdOut: filepath.Join(dir, "out.md"), jsonOut: filepath.Join(dir, "out.json")},
		probes: []float64{probe, probe, probe, probe},
		cases:  map[string][]result{},
		ratios: map[string][]float64{},
		vs:     map[string][]float64{},
	}
	for range 2 {
		r.cases["holdfast/w"] = append(r.cases["holdfast/w"], result{OpsPerSec: hf, Ops: int64(hf), CPUSeconds: 1, DiskBytes: uint64(hf) * 512, PayloadBytes: hf * 256})
		r.cases["redis/w"] = append(r.cases["redis/w"], result{OpsPerSec: redis, Ops: int64(redis)})
		r.ratios["holdfast/w"] = append(r.ratios["holdfast/w"], hf/probe)
		r.ratios["redis/w"] = append(r.ratios["redis/w"], redis/probe)
		r.vs["redis/w"] = append(r.vs["redis/w"], hf/redis)
	}
	return r, dir
}

func TestReport_FloorFailsOnlyFarBelowATarget(t *testing.T) {
	for _, c := range []struct {
		name             string
		probe, hf, redis float64
		floor            float64
		code             int
	}{
		{"below target, above a tenth of it", 1000, 5000, 2000, 0.1, 0},
		{"below a tenth of the probe target", 1000, 900, 100, 0.1, 1},
		{"below a tenth of the Redis target", 1000, 20000, 200000, 0.1, 1},
		{"no floor: never", 1000, 900, 200000, 0, 0},
		// A disk this fast makes every case CPU-bound: the probe ratio is not
		// checked, the ratio to Redis still is.
		{"fast probe", 50000, 4000, 2000, 0.1, 0},
		{"fast probe, far below Redis", 50000, 4000, 200000, 0.1, 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			r, _ := testReport(t, c.probe, c.hf, c.redis, c.floor)
			if got := r.write(); got != c.code {
				t.Fatalf("exit code %d, want %d", got, c.code)
			}
		})
	}
}

func TestReport_WritesTheTableAndTheJSON(t *testing.T) {
	r, dir := testReport(t, 1000, 5000, 2000, 0)
	r.failures = []string{"round 1, jetstream/w: boom"}
	if code := r.write(); code != 1 {
		t.Fatalf("a failed case should make the run fail, got %d", code)
	}
	md, err := os.ReadFile(filepath.Join(dir, "out.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"| w | writes/s | 5000 (5000–5000) | 5.00x (5.00x–5.00x) | 10x probe |", "2.50x (2.50x–2.50x) (target 2x)",
		"| w | 200.0 (200.0–200.0) |", "| 2.00 (2.00–2.00) |", "jetstream/w: boom"} {
		if !strings.Contains(string(md), want) {
			t.Errorf("the table lacks %q:\n%s", want, md)
		}
	}
	var summary struct {
		Probe     stat `json:"probe"`
		Workloads map[string]struct {
			Holdfast systemFigures `json:"holdfast"`
			Redis    systemFigures `json:"redis"`
		} `json:"workloads"`
	}
	b, err := os.ReadFile(filepath.Join(dir, "out.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &summary); err != nil {
		t.Fatal(err)
	}
	w := summary.Workloads["w"]
	if summary.Probe.Median != 1000 || w.Holdfast.RatioToProbe.Median != 5 || w.Redis.HoldfastOver == nil || w.Redis.HoldfastOver.Median != 2.5 {
		t.Fatalf("JSON summary %s", b)
	}
}

// TestRoundRatios_OverHTTPWithoutAnEmbeddedForm: a wire case with no embedded
// form (batch-increments-16x100) still gets its REST figure over Redis's, the
// ratio its target is on; and such a case runs on HTTP and Redis only.
func TestRoundRatios_OverHTTPWithoutAnEmbeddedForm(t *testing.T) {
	w, ok := findWorkload("batch-increments-16x100")
	if !ok {
		t.Fatal("no batch-increments-16x100")
	}
	if w.has(sysHoldfast) || w.has(sysJetStream) || !w.has(sysHoldfastHTTP) || !w.has(sysRedis) || !w.wire {
		t.Fatalf("batch-increments-16x100 runs on the wrong systems, or its target is not the REST figure's")
	}
	r := roundRatios([]workload{w}, map[string]result{
		"holdfast-http/batch-increments-16x100": {OpsPerSec: 40000},
		"redis/batch-increments-16x100":         {OpsPerSec: 800000},
	})
	if len(r) != 1 || r["redis/batch-increments-16x100/http"] != 0.05 {
		t.Fatalf("ratios %v, want only redis/batch-increments-16x100/http = 0.05", r)
	}
}

// TestWorkload_TargetsOver: increments-256's targets over Redis are on the
// REST figure (0.4x) and on the in-cluster Go client's (1x, issue 28 point
// 3); a case that is not a wire case has its targets on the embedded figure.
func TestWorkload_TargetsOver(t *testing.T) {
	inc, _ := findWorkload("increments-256")
	objs, _ := findWorkload("1000-objects")
	for _, c := range []struct {
		w    workload
		peer string
		want []peerTarget
	}{
		{inc, sysRedis, []peerTarget{{sysHoldfastHTTP, 0.4}, {sysHoldfastClient, 1}}},
		{inc, sysJetStream, nil},
		{objs, sysRedis, []peerTarget{{sysHoldfast, 2.5}}},
		{objs, sysJetStream, []peerTarget{{sysHoldfast, 10}}},
	} {
		if got := c.w.targetsOver(c.peer); !slices.Equal(got, c.want) {
			t.Errorf("%s over %s: %v, want %v", c.w.name, c.peer, got, c.want)
		}
	}
	if !inc.has(sysHoldfastClient) || objs.has(sysHoldfastClient) {
		t.Errorf("only increments-256 runs on %s", sysHoldfastClient)
	}
}

// TestReport_ClientRatioAndTarget: the in-cluster Go client's figure over
// Redis's is taken round by round, printed beside the REST figure's, each
// with its own target, and checked against the floor.
func TestReport_ClientRatioAndTarget(t *testing.T) {
	w := workload{name: "w", title: "w", unit: "increments/s", vsRedis: 0.4, wire: true, vsRedisClient: 1}
	for _, c := range []struct {
		client float64
		cell   string
		code   int
	}{
		{12000, "| —; over HTTP 0.50x (target 0.4x); Go client 1.20x (target 1x) |", 0},
		{500, "| —; over HTTP 0.50x (target 0.4x); Go client 0.05x (target 1x) |", 1}, // below a tenth of 1x
	} {
		got := map[string]result{"holdfast-http/w": {OpsPerSec: 5000}, "holdfast-client/w": {OpsPerSec: c.client}, "redis/w": {OpsPerSec: 10000}}
		dir := t.TempDir()
		r := &report{
			cfg: driveConfig{rounds: 1, floor: 0.1, workloads: []workload{w}, systems: []string{sysHoldfastHTTP, sysHoldfastClient, sysRedis},
				base: dir, mdOut: filepath.Join(dir, "out.md")},
			cases: map[string][]result{}, ratios: map[string][]float64{}, vs: map[string][]float64{},
		}
		for name, res := range got {
			r.cases[name] = []result{res}
		}
		for k, v := range roundRatios(r.cfg.workloads, got) {
			r.vs[k] = []float64{v}
		}
		if code := r.write(); code != c.code {
			t.Errorf("client at %.0f/s: exit code %d, want %d", c.client, code, c.code)
		}
		md, err := os.ReadFile(filepath.Join(dir, "out.md"))
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(md), c.cell) {
			t.Errorf("the table lacks %q:\n%s", c.cell, md)
		}
	}
}
