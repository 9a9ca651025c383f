package jsonvalid

import (
	"encoding/json"
	"strings"
	"testing"
)

// cases are inputs at the edges of the grammar; each is checked against
// encoding/json.Valid, and they seed FuzzValid.
var cases = []string{
	``, ` `, `null`, ` null `, "\tnull\r\n", `nul`, `nulll`, `true`, `false`, `tru`, `True`,
	`0`, `-0`, `-`, `01`, `-01`, `1.`, `1.5`, `.5`, `1e5`, `1E+5`, `1e-5`, `1e`, `1e+`, `-1.5e10`, `1.5.5`, `+1`, `0x10`, `123456789012345678901234567890`,
	`""`, `"a"`, `"\""`, `"\\"`, `"\/"`, `"\b\f\n\r\t"`, `"\u00e9"`, `"\u00E9"`, `"\u00g9"`, `"\u00e"`, `"\x"`, `"\'"`, "\"a\x01\"", "\"a\x7f\"", "\"\xff\xfe\"", "\"é\"", `"abc`, `"\`, `"\u`,
	`[]`, `[ ]`, `[1]`, `[1,]`, `[,1]`, `[1 2]`, `[1,2]`, `[`, `]`, `[[[]]]`, `[[]`, `[1,[2,[3]]]`,
	`{}`, `{ }`, `{"a":1}`, `{"a" : 1 , "b":[true]}`, `{"a":1,}`, `{a:1}`, `{"a"}`, `{"a":}`, `{"a" 1}`, `{1:1}`, `{"a":1 "b":2}`, `{`, `}`, `{"a":{"b":{}}}`,
	`1 2`, `[] []`, `{}x`, "\x00", "null\x00", "\ufeffnull", "\u00a0null", `"` + strings.Repeat("a", 300) + `"`,
}

func TestValid_AgreesWithEncodingJSON(t *testing.T) {
	for _, c := range cases {
		if got, want := Valid([]byte(c)), json.Valid([]byte(c)); got != want {
			t.Errorf("Valid(%q) = %v, encoding/json says %v", c, got, want)
		}
	}
}

func TestValid_NestingDepth(t *testing.T) {
	for _, depth := range []int{1, 9999, 10000, 10001, 20000} {
		for _, open := range []string{"[", `{"k":`} {
			closer := "]"
			if open != "[" {
				closer = "}"
			}
			b := []byte(strings.Repeat(open, depth) + "1" + strings.Repeat(closer, depth))
			if got, want := Valid(b), json.Valid(b); got != want || got != (depth <= maxDepth) {
				t.Errorf("%d levels of %s: Valid %v, encoding/json %v", depth, open, got, want)
			}
		}
	}
}

func FuzzValid(f *testing.F) {
	for _, c := range cases {
		f.Add([]byte(c))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		if got, want := Valid(b), json.Valid(b); got != want {
			t.Fatalf("Valid(%q) = %v, encoding/json says %v", b, got, want)
		}
	})
}

// record is a log record body like the benchmarks' (256 bytes).
var record = func() []byte {
	b, _ := json.Marshal(map[string]any{"id": 12345, "kind": "order.created", "customer": "c-000042", "items": []any{map[string]any{"sku": "sku-1", "qty": 2, "price": 12.5}}, "note": strings.Repeat("x", 120)})
	return b
}()

func BenchmarkValid(b *testing.B) {
	b.SetBytes(int64(len(record)))
	for b.Loop() {
		if !Valid(record) {
			b.Fatal("invalid")
		}
	}
}

func BenchmarkEncodingJSONValid(b *testing.B) {
	b.SetBytes(int64(len(record)))
	for b.Loop() {
		if !json.Valid(record) {
			b.Fatal("invalid")
		}
	}
}
