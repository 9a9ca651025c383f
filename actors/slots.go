package actors

import (
	"encoding/json"
	"sort"
)

// slotTable holds an object's slots. Most objects have a few slots: up to
// smallSlots live in a slice (a Go map costs several hundred bytes even for one
// entry); beyond that, a map.
type slotTable struct {
	small []slotEntry
	big   map[string]json.RawMessage
}

type slotEntry struct {
	name  string
	value json.RawMessage
}

const smallSlots = 8

func (t *slotTable) get(name string) (json.RawMessage, bool) {
	if t.big != nil {
		v, ok := t.big[name]
		return v, ok
	}
	for i := range t.small {
		if t.small[i].name == name {
			return t.small[i].value, true
		}
	}
	return nil, false
}

func (t *slotTable) set(name string, v json.RawMessage) {
	if t.big != nil {
		t.big[name] = v
		return
	}
	for i := range t.small {
		if t.small[i].name == name {
			t.small[i].value = v
			return
		}
	}
	if len(t.small) < smallSlots {
		t.small = append(t.small, slotEntry{name, v})
		return
	}
	t.big = make(map[string]json.RawMessage, 2*smallSlots)
	for _, e := range t.small {
		t.big[e.name] = e.value
	}
	t.big[name] = v
	t.small = nil
}

func (t *slotTable) delete(name string) {
	if t.big != nil {
		delete(t.big, name)
		return
	}
	for i := range t.small {
		if t.small[i].name == name {
			t.small = append(t.small[:i], t.small[i+1:]...)
			if len(t.small) == 0 {
				t.small = nil
			}
			return
		}
	}
}

func (t *slotTable) len() int {
	if t.big != nil {
		return len(t.big)
	}
	return len(t.small)
}

// each calls fn for every slot, in no particular order.
func (t *slotTable) each(fn func(name string, v json.RawMessage)) {
	if t.big != nil {
		for n, v := range t.big {
			fn(n, v)
		}
		return
	}
	for _, e := range t.small {
		fn(e.name, e.value)
	}
}

// names returns the slot names, sorted.
func (t *slotTable) names() []string {
	out := make([]string, 0, t.len())
	t.each(func(n string, _ json.RawMessage) { out = append(out, n) })
	sort.Strings(out)
	return out
}
