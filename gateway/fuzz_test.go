package gateway

import (
	"bytes"
	"encoding/json"
	"errors"
	"testing"

	"github.com/holdfast/holdfast/actors"
)

func fuzzState() map[string]json.RawMessage {
	return map[string]json.RawMessage{
		"n": json.RawMessage("41"), "f": json.RawMessage("1.5"), "l": json.RawMessage(`[1,"a"]`),
		"s": json.RawMessage(`"text"`), "o": json.RawMessage(`{"a":1}`),
	}
}

// checkPlan applies ops to the fuzz state and checks the invariants of a KV write:
// refusals are user errors that change nothing; a plan touches each slot once,
// never reports an absent slot as deleted, records the true previous values, and
// ends in the same state as applying the ops one at a time.
func checkPlan(t *testing.T, ops []actors.Op) {
	state := fuzzState()
	changes, _, err := actors.Plan(state, ops)
	if err != nil {
		var e *actors.Error
		if !errors.As(err, &e) || (e.Kind != actors.KindInvalid && e.Kind != actors.KindBadRequest && e.Kind != actors.KindTooLarge) {
			t.Fatalf("plan error %v is not a user error", err)
		}
		return
	}
	final := fuzzState()
	seen := map[string]bool{}
	for _, c := range changes {
		if seen[c.Slot] {
			t.Fatalf("slot %q changed twice in one plan", c.Slot)
		}
		seen[c.Slot] = true
		if c.Value == nil && c.Previous == nil {
			t.Fatalf("slot %q absent before and after is reported", c.Slot)
		}
		if !bytes.Equal(c.Previous, state[c.Slot]) {
			t.Fatalf("slot %q previous %s, state holds %s", c.Slot, c.Previous, state[c.Slot])
		}
		if c.Value == nil {
			delete(final, c.Slot)
			continue
		}
		var buf bytes.Buffer
		if json.Compact(&buf, c.Value) != nil || !bytes.Equal(buf.Bytes(), c.Value) {
			t.Fatalf("slot %q value %q is not compact JSON", c.Slot, c.Value)
		}
		final[c.Slot] = c.Value
	}
	// The same ops, one write each, reach the same state.
	step := fuzzState()
	for _, op := range ops {
		ch, _, err := actors.Plan(step, []actors.Op{op})
		if err != nil {
			t.Fatalf("op %+v failed alone after the whole list succeeded: %v", op, err)
		}
		for _, c := range ch {
			if c.Value == nil {
				delete(step, c.Slot)
			} else {
				step[c.Slot] = c.Value
			}
		}
	}
	a, _ := json.Marshal(final)
	b, _ := json.Marshal(step)
	if !bytes.Equal(a, b) {
		t.Fatalf("plan ends in %s, op by op in %s", a, b)
	}
}

func FuzzParseTransaction(f *testing.F) {
	for _, s := range []string{
		`[{"op":"set","key":"a","value":1}]`,
		`[{"op":"increment","key":"n","by":2},{"op":"append","key":"l","value":null},{"op":"delete","key":"s"}]`,
		`[{"op":"set","key":"x","value":1},{"op":"delete","key":"x"}]`,
		`[{"op":"increment","key":"f","by":1e308},{"op":"increment","key":"f","by":1e308}]`,
		`[{"op":"increment","key":"n","by":9223372036854775807}]`,
		`[{"op":"append","key":"s","value":1}]`, `[]`, `{}`, `[1]`, `[{"op":1}]`, `null`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		ops, err := ParseTransaction(body)
		if err != nil {
			var e *actors.Error
			if !errors.As(err, &e) {
				t.Fatalf("parse error %v is not a user error", err)
			}
			return
		}
		checkPlan(t, ops)
	})
}

func FuzzParsePatch(f *testing.F) {
	for _, s := range []string{
		`{"a":1,"b":null}`, `{"n":null,"n":2}`, `{}`, `{"log":1}`, `{"x":{"y":[1,2]}}`, `[1]`, `{"a":1} {"b":2}`, `{"":1}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		ops, err := ParsePatch(body)
		if err != nil {
			var e *actors.Error
			if !errors.As(err, &e) || e.Kind != actors.KindBadRequest {
				t.Fatalf("parse error %v is not a bad request", err)
			}
			return
		}
		for _, op := range ops {
			if op.Op != "set" && op.Op != "delete" {
				t.Fatalf("patch produced op %q", op.Op)
			}
		}
		checkPlan(t, ops)
	})
}
