package gateway

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"unicode/utf8"

	"github.com/holdfast/holdfast/actors"
)

// checkText refuses a JSON body that is not Unicode text (RFC 8259 section
// 8.1): bytes that are not UTF-8, or a \u escape of half a UTF-16 surrogate
// pair. encoding/json keeps the first byte for byte in a raw value (stored,
// then relayed in a text frame that websocket clients refuse: issue 26) and
// turns both into U+FFFD in a decoded string (a slot name, a message id
// silently renamed). Every body the gateway reads is JSON, so this runs once
// per body, before any decoding.
func checkText(body []byte) *apiError {
	if !utf8.Valid(body) {
		return badRequest("the request body is not valid UTF-8")
	}
	if esc, ok := loneSurrogate(body); ok {
		return badRequest("the request body holds the escape " + esc + ", half a UTF-16 surrogate pair: not Unicode text")
	}
	return nil
}

// loneSurrogate returns the first \uD800-\uDFFF escape in b that is not a high
// surrogate followed at once by an escaped low one. Backslashes occur only in
// strings of valid JSON, and each escape is skipped whole, so an escaped
// backslash followed by "ud800" is not taken for an escape.
func loneSurrogate(b []byte) (string, bool) {
	for i := 0; ; {
		j := bytes.IndexByte(b[i:], '\\')
		if j < 0 || i+j+1 >= len(b) {
			return "", false
		}
		i += j
		if b[i+1] != 'u' {
			i += 2 // a one-character escape, \\ included
			continue
		}
		r, ok := hex4(b, i+2)
		switch {
		case !ok:
			return "", false // not JSON: the decoder says so
		case r < 0xD800 || r > 0xDFFF:
			i += 6
			continue
		case r <= 0xDBFF && i+12 <= len(b) && b[i+6] == '\\' && b[i+7] == 'u':
			if lo, ok := hex4(b, i+8); ok && lo >= 0xDC00 && lo <= 0xDFFF {
				i += 12
				continue
			}
		}
		return string(b[i : i+6]), true
	}
}

// hex4 decodes the four hex digits at b[i:].
func hex4(b []byte, i int) (rune, bool) {
	if i+4 > len(b) {
		return 0, false
	}
	var r rune
	for _, c := range b[i : i+4] {
		switch {
		case '0' <= c && c <= '9':
			c -= '0'
		case 'a' <= c && c <= 'f':
			c -= 'a' - 10
		case 'A' <= c && c <= 'F':
			c -= 'A' - 10
		default:
			return 0, false
		}
		r = r<<4 | rune(c)
	}
	return r, true
}

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
