package actors

import (
	"encoding/json"
	"fmt"
	"testing"
)

// TestSlotTable_MatchesAMap drives a slotTable through the small and the map
// representation and compares it with a plain map after every step.
func TestSlotTable_MatchesAMap(t *testing.T) {
	var tab slotTable
	model := map[string]json.RawMessage{}
	check := func(step string) {
		t.Helper()
		if tab.len() != len(model) {
			t.Fatalf("%s: len %d, want %d", step, tab.len(), len(model))
		}
		for n, v := range model {
			if got, ok := tab.get(n); !ok || string(got) != string(v) {
				t.Fatalf("%s: %s = %s %v, want %s", step, n, got, ok, v)
			}
		}
		if _, ok := tab.get("absent"); ok {
			t.Fatalf("%s: absent slot found", step)
		}
		seen := 0
		tab.each(func(n string, v json.RawMessage) {
			seen++
			if string(model[n]) != string(v) {
				t.Fatalf("%s: each gave %s=%s", step, n, v)
			}
		})
		if seen != len(model) {
			t.Fatalf("%s: each visited %d", step, seen)
		}
	}
	for i := 0; i < 3*smallSlots; i++ {
		n, v := fmt.Sprintf("s%d", i%(2*smallSlots)), json.RawMessage(fmt.Sprint(i))
		tab.set(n, v)
		model[n] = v
		check(fmt.Sprintf("set %s", n))
		if i%3 == 0 {
			d := fmt.Sprintf("s%d", i/2)
			tab.delete(d)
			delete(model, d)
			check(fmt.Sprintf("delete %s", d))
		}
	}
	if names := tab.names(); len(names) != len(model) || names[0] > names[len(names)-1] {
		t.Fatalf("names %v", names)
	}
}
