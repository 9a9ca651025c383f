package actors

import (
	"bytes"
	"encoding/json"
	"math"
	"strconv"

	"github.com/holdfast/holdfast/internal/jsonvalid"
)

// Size limits of spec/objects.md.
const (
	MaxSlotValueBytes  = 1 << 20  // one slot's JSON value
	MaxObjectBytes     = 16 << 20 // sum of slot names and values
	MaxTransactionOps  = 1000
	MaxIdempotencyKey  = 128
	IdempotencyWindowH = 24
)

// Op is one operation of a KV write. Every KV write (set, patch, increment, append,
// delete, transaction) is a list of Ops applied in order.
type Op struct {
	Op    string          `json:"op"`              // set | delete | increment | append
	Key   string          `json:"key"`             // the slot
	Value json.RawMessage `json:"value,omitempty"` // set, append; nil when absent
	By    json.RawMessage `json:"by,omitempty"`    // increment; nil means 1
	// compact: Value is json.Marshal's output (the Go API made it), valid
	// and compact already. Never set from outside the process: unexported, it
	// crosses neither JSON nor the cluster's wire.
	compact bool
}

// Change is the effect of a write on one slot.
type Change struct {
	Slot     string
	Value    json.RawMessage // nil: the slot was deleted
	Previous json.RawMessage // nil: the slot did not exist
}

// slotReader reads the committed state the plan starts from.
type slotReader interface {
	slot(name string) (json.RawMessage, bool)
	stateBytes() int
}

// plan applies ops, in order, to a view of state without changing it. It returns
// one Change per touched slot in first-touch order (a slot absent before and after
// is left out), and the final value of the last incremented slot. Any failing op
// fails the whole plan; the error names the op when there are several.
func plan(st slotReader, ops []Op) ([]Change, json.RawMessage, error) {
	changes := make([]Change, 0, len(ops))
	// touched finds a slot's change: a linear search for the usual handful of ops,
	// a map for long transactions.
	var index map[string]int
	if len(ops) > 8 {
		index = make(map[string]int, len(ops))
	}
	touched := func(slot string) (int, bool) {
		if index != nil {
			i, ok := index[slot]
			return i, ok
		}
		for i := range changes {
			if changes[i].Slot == slot {
				return i, true
			}
		}
		return 0, false
	}
	current := func(slot string) (json.RawMessage, bool) {
		if i, ok := touched(slot); ok {
			return changes[i].Value, changes[i].Value != nil
		}
		return st.slot(slot)
	}
	var incremented json.RawMessage
	for i, op := range ops {
		at := func(err *Error) *Error {
			if len(ops) > 1 {
				err.Msg = "op " + strconv.Itoa(i) + ": " + err.Msg
			}
			return err
		}
		if err := validateSlot(op.Key); err != nil {
			if op.Key == "" {
				return nil, nil, at(invalidf("missing key"))
			}
			return nil, nil, at(err.(*Error))
		}
		var next json.RawMessage
		switch op.Op {
		case "set":
			if op.Value == nil {
				return nil, nil, at(invalidf("set needs a value"))
			}
			v, err := op.value()
			if err != nil {
				return nil, nil, at(err)
			}
			if string(v) == "null" {
				return nil, nil, at(invalidf("use DELETE to remove a slot"))
			}
			next = v
		case "delete":
			next = nil
		case "increment":
			cur, ok := current(op.Key)
			if !ok {
				cur = json.RawMessage("0")
			}
			by := op.By
			if by == nil {
				by = json.RawMessage("1")
			}
			v, err := increment(op.Key, cur, by)
			if err != nil {
				return nil, nil, at(err)
			}
			next, incremented = v, v
		case "append":
			if op.Value == nil {
				return nil, nil, at(invalidf("append needs a value"))
			}
			elem, err := op.value()
			if err != nil {
				return nil, nil, at(err)
			}
			cur, ok := current(op.Key)
			if !ok {
				cur = json.RawMessage("[]")
			}
			if len(cur) == 0 || cur[0] != '[' {
				return nil, nil, at(invalidf("slot %q is not a list", op.Key))
			}
			next = appendElement(cur, elem)
		case "":
			return nil, nil, at(invalidf("missing op"))
		default:
			return nil, nil, at(invalidf("unknown op %q", op.Op))
		}
		if j, ok := touched(op.Key); ok {
			changes[j].Value = next
			continue
		}
		prev, _ := st.slot(op.Key)
		if index != nil {
			index[op.Key] = len(changes)
		}
		changes = append(changes, Change{Slot: op.Key, Value: next, Previous: prev})
	}
	// A slot absent before and after (delete of a missing slot) is no change.
	kept := changes[:0]
	size := st.stateBytes()
	for _, c := range changes {
		if c.Value == nil && c.Previous == nil {
			continue
		}
		if len(c.Value) > MaxSlotValueBytes {
			return nil, nil, tooLargef("slot %q value is %d bytes, at most %d", c.Slot, len(c.Value), MaxSlotValueBytes)
		}
		size += slotBytes(c.Slot, c.Value) - slotBytes(c.Slot, c.Previous)
		kept = append(kept, c)
	}
	if size > MaxObjectBytes {
		return nil, nil, tooLargef("the object would hold %d bytes, at most %d", size, MaxObjectBytes)
	}
	return kept, incremented, nil
}

// slotBytes is what one slot counts towards MaxObjectBytes.
func slotBytes(name string, v json.RawMessage) int {
	if v == nil {
		return 0
	}
	return len(name) + len(v)
}

// compactJSON validates v and removes its insignificant whitespace. A value with
// no whitespace byte at all is already compact and is only validated.
// value returns the op's Value as compact JSON, checked unless the Go API
// made it.
func (op *Op) value() (json.RawMessage, *Error) {
	if op.compact {
		return op.Value, nil
	}
	return compactJSON(op.Value)
}

func compactJSON(v json.RawMessage) (json.RawMessage, *Error) {
	if bytes.IndexAny(v, " \t\r\n") < 0 {
		if !jsonvalid.Valid(v) {
			return nil, badRequestf("value is not valid JSON")
		}
		return append(json.RawMessage(nil), v...), nil // never alias the caller's buffer
	}
	var b bytes.Buffer
	b.Grow(len(v))
	if err := json.Compact(&b, v); err != nil {
		return nil, badRequestf("value is not valid JSON")
	}
	return b.Bytes(), nil
}

func appendElement(list, elem json.RawMessage) json.RawMessage {
	out := make([]byte, 0, len(list)+len(elem)+1)
	out = append(out, list[:len(list)-1]...)
	if len(list) > 2 {
		out = append(out, ',')
	}
	out = append(out, elem...)
	return append(out, ']')
}

// number is a parsed JSON number: an int64 when written as an integer that fits,
// else a float64.
type number struct {
	isInt bool
	i     int64
	f     float64
}

func parseNumber(raw json.RawMessage) (number, bool) {
	s := string(bytes.TrimSpace(raw))
	if s == "" || !(s[0] == '-' || (s[0] >= '0' && s[0] <= '9')) {
		return number{}, false
	}
	if !json.Valid([]byte(s)) {
		return number{}, false
	}
	if !bytes.ContainsAny([]byte(s), ".eE") {
		if i, err := strconv.ParseInt(s, 10, 64); err == nil {
			return number{isInt: true, i: i}, true
		}
	}
	f, err := strconv.ParseFloat(s, 64)
	if err != nil && !math.IsInf(f, 0) {
		return number{}, false
	}
	return number{f: f}, true
}

func (n number) float() float64 {
	if n.isInt {
		return float64(n.i)
	}
	return n.f
}

// increment adds by to cur: integer + integer stays an int64 (overflow is refused),
// anything else is float64 (a non-finite result is refused).
func increment(slot string, cur, by json.RawMessage) (json.RawMessage, *Error) {
	b, ok := parseNumber(by)
	if !ok {
		return nil, invalidf("by must be a number")
	}
	c, ok := parseNumber(cur)
	if !ok {
		return nil, invalidf("slot %q is not numeric", slot)
	}
	if c.isInt && b.isInt {
		s := c.i + b.i
		if (b.i > 0 && s < c.i) || (b.i < 0 && s > c.i) {
			return nil, invalidf("increment of slot %q overflows int64", slot)
		}
		return strconv.AppendInt(nil, s, 10), nil
	}
	f := c.float() + b.float()
	if math.IsInf(f, 0) || math.IsNaN(f) {
		return nil, invalidf("increment of slot %q overflows float64", slot)
	}
	return formatFloat(f), nil
}

// formatFloat writes f as JSON that reads back as a float: an integral value keeps
// a ".0" so that later increments stay float64.
func formatFloat(f float64) json.RawMessage {
	b, _ := json.Marshal(f)
	if !bytes.ContainsAny(b, ".eE") {
		b = append(b, ".0"...)
	}
	return b
}

// mapState is a slotReader over a plain map.
type mapState map[string]json.RawMessage

func (m mapState) slot(name string) (json.RawMessage, bool) { v, ok := m[name]; return v, ok }

func (m mapState) stateBytes() int {
	n := 0
	for k, v := range m {
		n += slotBytes(k, v)
	}
	return n
}

// Plan computes the changes that ops would make to state, without changing it.
// It is the pure core of every KV write, exported for tests and fuzzing.
func Plan(state map[string]json.RawMessage, ops []Op) ([]Change, json.RawMessage, error) {
	ch, v, err := plan(mapState(state), ops)
	if err != nil {
		return nil, nil, err
	}
	return ch, v, nil
}
