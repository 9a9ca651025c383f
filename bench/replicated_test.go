package main

import (
	"os"
	"slices"
	"strings"
	"testing"
)

func TestReplicatedPeersRunOnlyTheWriteCasesAndOnlyWhenNamed(t *testing.T) {
	for _, s := range replicatedSystems {
		if slices.Contains(systems, s) {
			t.Errorf("%s runs by default (it is in systems, the -systems default)", s)
		}
		if !knownSystem(s) {
			t.Errorf("%s: not a known system", s)
		}
		var ran []string
		for _, w := range workloads {
			if w.has(s) {
				ran = append(ran, w.name)
			}
		}
		if !slices.Equal(ran, replicatedWorkloads) {
			t.Errorf("%s runs %v, want %v", s, ran, replicatedWorkloads)
		}
	}
	if knownSystem("etcd7") {
		t.Error("etcd7 accepted")
	}
}

func TestReportReplicatedTable(t *testing.T) {
	r, dir := testReport(t, 1000, 5000, 2000, 0)
	w, _ := findWorkload("one-writer")
	r.cfg.workloads = []workload{w}
	r.cfg.systems = []string{sysEtcd3, sysJetStreamR3}
	for range 3 {
		r.cases["etcd3/one-writer"] = append(r.cases["etcd3/one-writer"],
			result{OpsPerSec: 300, Ops: 900, CPUSeconds: 0.09, ServerCPU: 0.9, LatencyP50Ms: 3, LatencyP99Ms: 9})
		r.ratios["etcd3/one-writer"] = append(r.ratios["etcd3/one-writer"], 0.3)
	}
	r.cases["jetstream-r3/one-writer"] = []result{{OpsPerSec: 700, Ops: 700, CPUSeconds: 0.7, LatencyP50Ms: 1.5, LatencyP99Ms: 4}}
	if code := r.write(); code != 0 {
		t.Fatalf("exit code %d", code)
	}
	md, err := os.ReadFile(r.cfg.mdOut)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"Replicated peers (issue 27)",
		"| one-writer | etcd, 3 members | 300 (300–300) | 0.30x (0.30x–0.30x) | — | 100.0 (100.0–100.0) | 1000.0 (1000.0–1000.0) |",
		"| 3.00 (3.00–3.00) | 9.00 (9.00–9.00) |",
		"| one-writer | JetStream R3 | 700 | — | — | 1000.0 | — |",
		"| 1.50 | 4.00 |",
	} {
		if !strings.Contains(string(md), want) {
			t.Errorf("report lacks %q:\n%s", want, md)
		}
	}
	_ = dir
}
