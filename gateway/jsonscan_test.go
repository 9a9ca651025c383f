package gateway

import (
	"bytes"
	"encoding/json"
	"io"
	"reflect"
	"testing"
)

// refMembers is objectMembers by json.Decoder's Token API (what the scanner
// replaced), the reference the fuzz test compares with.
func refMembers(b []byte) ([]member, bool) {
	d := json.NewDecoder(bytes.NewReader(b))
	if tok, err := d.Token(); err != nil || tok != json.Delim('{') {
		return nil, false
	}
	var out []member
	for d.More() {
		tok, err := d.Token()
		if err != nil {
			return nil, false
		}
		var v json.RawMessage
		if err := d.Decode(&v); err != nil {
			return nil, false
		}
		out = append(out, member{tok.(string), v})
	}
	if _, err := d.Token(); err != nil {
		return nil, false
	}
	_, err := d.Token()
	return out, err == io.EOF
}

// FuzzJSONScan: on valid JSON, objectMembers and arrayElements split exactly
// as encoding/json does; on anything, they do not panic.
func FuzzJSONScan(f *testing.F) {
	for _, s := range []string{
		`{}`, `[]`, ` { "a" : 1 , "b":[1,{"c":"}]"}], "d\"e": "x\\"} `, `{"a":{"b":{"c":[]}}}`,
		`[1, "two", {"3": [4]}, null, true, -5.5e3]`, `{"\u00e9":"\ud83d\ude00"}`, `{"a":1`, `{"a" 1}`, `"s"`, `[1,]`,
		`{"ops":[{"object":"c/x","op":"increment","slot":"n","by":1}]}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		got, gerr := objectMembers(b)
		aGot, aerr := arrayElements(b)
		if !json.Valid(b) {
			return // only no panic
		}
		want, ok := refMembers(b)
		if ok != (gerr == nil) || (ok && !reflect.DeepEqual(normalize(got), normalize(want))) {
			t.Fatalf("objectMembers(%q) = %v, %v; encoding/json: %v, %v", b, got, gerr, want, ok)
		}
		var arr []json.RawMessage
		isArr := json.Unmarshal(b, &arr) == nil && arr != nil
		if isArr != (aerr == nil) || (isArr && !reflect.DeepEqual(aGot, arr)) {
			t.Fatalf("arrayElements(%q) = %q, %v; encoding/json: %q", b, aGot, aerr, arr)
		}
	})
}

// normalize makes an empty member list and none compare equal.
func normalize(ms []member) []member {
	if len(ms) == 0 {
		return nil
	}
	return ms
}
