package gateway

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"

	"github.com/holdfast/holdfast/actors"
)

func bodyError(k actors.Kind, format string, a ...any) *actors.Error {
	return &actors.Error{Kind: k, Msg: fmt.Sprintf(format, a...)}
}

// ParsePatch turns a PATCH body (a JSON object) into ops in member order: null
// deletes a slot, any other value sets it. A member repeated keeps its first
// position and its last value. A body that is not a JSON object is a bad request.
func ParsePatch(body []byte) ([]actors.Op, error) {
	d := json.NewDecoder(bytes.NewReader(body))
	tok, err := d.Token()
	if err != nil || tok != json.Delim('{') {
		return nil, bodyError(actors.KindBadRequest, "the body must be a JSON object of slots")
	}
	var ops []actors.Op
	index := map[string]int{}
	for d.More() {
		tok, err := d.Token()
		if err != nil {
			return nil, bodyError(actors.KindBadRequest, "the body is not valid JSON")
		}
		name, _ := tok.(string)
		var v json.RawMessage
		if err := d.Decode(&v); err != nil {
			return nil, bodyError(actors.KindBadRequest, "the body is not valid JSON")
		}
		op := actors.PatchOp(name, v)
		if i, dup := index[name]; dup {
			ops[i] = op
			continue
		}
		index[name] = len(ops)
		ops = append(ops, op)
	}
	if _, err := d.Token(); err != nil {
		return nil, bodyError(actors.KindBadRequest, "the body is not valid JSON")
	}
	if _, err := d.Token(); err != io.EOF {
		return nil, bodyError(actors.KindBadRequest, "the body holds more than one JSON value")
	}
	return ops, nil
}

// ParseTransaction turns a POST /transaction body (a JSON array of ops) into ops.
// A body that is not a JSON array is a bad request; an element that is not an
// object, or whose op or key is not a string, is a malformed op (422). The ops'
// meaning is checked when they are applied.
func ParseTransaction(body []byte) ([]actors.Op, error) {
	var raw []json.RawMessage
	if err := json.Unmarshal(body, &raw); err != nil || (raw == nil && !bytes.HasPrefix(bytes.TrimSpace(body), []byte("["))) {
		return nil, bodyError(actors.KindBadRequest, "the body must be a JSON array of ops")
	}
	ops := make([]actors.Op, 0, len(raw))
	for i, el := range raw {
		var fields map[string]json.RawMessage
		if err := json.Unmarshal(el, &fields); err != nil || fields == nil {
			return nil, bodyError(actors.KindInvalid, "op %d: not an object", i)
		}
		var op actors.Op
		for _, f := range [...]struct {
			name string
			dst  *string
		}{{"op", &op.Op}, {"key", &op.Key}} {
			v, ok := fields[f.name]
			if !ok {
				continue
			}
			if err := json.Unmarshal(v, f.dst); err != nil || string(v) == "null" {
				return nil, bodyError(actors.KindInvalid, "op %d: %s must be a string", i, f.name)
			}
		}
		op.Value = fields["value"]
		op.By = fields["by"]
		ops = append(ops, op)
	}
	return ops, nil
}
