package main

import (
	"testing"

	"github.com/holdfast/holdfast/actors"
)

func TestMemoryLimit_FromBudgetUnlessGOMEMLIMIT(t *testing.T) {
	none := func(string) string { return "" }
	if got, ok := memoryLimit(1<<30, none); !ok || got != (1<<30)/100*85 {
		t.Errorf("budget 1 GiB: limit %d %v, want 85%%", got, ok)
	}
	if got, ok := memoryLimit(0, none); !ok || got != actors.DefaultMemoryBudget()/100*85 {
		t.Errorf("default budget: limit %d %v, want 85%% of the default budget", got, ok)
	}
	set := func(k string) string {
		if k == "GOMEMLIMIT" {
			return "512MiB"
		}
		return ""
	}
	if _, ok := memoryLimit(1<<30, set); ok {
		t.Error("GOMEMLIMIT is set, but the limit would be replaced")
	}
}
