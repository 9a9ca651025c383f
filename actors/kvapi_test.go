package actors

import (
	"bytes"
	"encoding/json"
	"math/rand/v2"
	"testing"
)

// TestMarshalValue_StringsAsJSONMarshal: a string value is encoded exactly as
// json.Marshal encodes it, whether or not it takes the fast path.
func TestMarshalValue_StringsAsJSONMarshal(t *testing.T) {
	cases := []string{
		"", "plain", "with space", "a<b", "a>b", "a&b", `quote"d`, `back\slash`,
		"tab\there", "nl\n", "\x00", "\x1f", "\x7f", "é", "\u2028", "\u2029",
		"\xff", "日本", "100% {json}: [1,2]",
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for range 2000 {
		b := make([]byte, rng.IntN(40))
		for i := range b {
			b[i] = byte(rng.IntN(256))
			if rng.IntN(4) > 0 {
				b[i] = byte(0x20 + rng.IntN(0x60)) // mostly printable ASCII
			}
		}
		cases = append(cases, string(b))
	}
	plain := 0
	for _, s := range cases {
		want, err := json.Marshal(s)
		if err != nil {
			t.Fatal(err)
		}
		got, compact, err := marshalValue(s)
		if err != nil || !compact {
			t.Fatalf("marshalValue(%q): compact %v, err %v", s, compact, err)
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("marshalValue(%q) = %s, json.Marshal gives %s", s, got, want)
		}
		if _, ok := quotePlain(s); ok {
			plain++
		}
	}
	if plain < 100 {
		t.Fatalf("only %d of %d strings took the fast path", plain, len(cases))
	}
	if _, ok := quotePlain("a<b"); ok {
		t.Fatal(`quotePlain took "a<b", which json.Marshal escapes`)
	}
}
