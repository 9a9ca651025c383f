package cold

import (
	"encoding/base64"
	"fmt"
	"math/rand"
	"strings"
	"testing"
)

// nameOf returns n bytes of valid UTF-8 from rng: ASCII, two- and three-byte
// letters, and a slash-free mix of punctuation.
func nameOf(rng *rand.Rand, n int) string {
	var b strings.Builder
	for b.Len() < n {
		r := []rune{'a', 'Z', '9', '-', '_', '.', ':', '~', 'é', 'ü', '€', '界'}[rng.Intn(12)]
		if b.Len()+len(string(r)) > n {
			r = 'x'
		}
		b.WriteRune(r)
	}
	return b.String()
}

// TestLogSegmentKey_OldLayoutForShortNames: a name of up to 191 bytes is one
// base64url segment, exactly as before issue 26.
func TestLogSegmentKey_OldLayoutForShortNames(t *testing.T) {
	rng := rand.New(rand.NewSource(1))
	enc := base64.RawURLEncoding
	for n := 1; n <= 191; n++ {
		app, typ, key := nameOf(rng, min(n, 64)), nameOf(rng, n), nameOf(rng, n)
		old := fmt.Sprintf("log/%s/%s/%s/%020d", enc.EncodeToString([]byte(app)), enc.EncodeToString([]byte(typ)), enc.EncodeToString([]byte(key)), uint64(n))
		if got := LogSegmentKey(app, typ, key, uint64(n)); got != old {
			t.Fatalf("%d-byte names: %s, the old layout had %s", n, got, old)
		}
	}
	if k := LogSegmentKey("a", strings.Repeat("t", 192), "k", 0); strings.Count(k, "/") != 5 {
		t.Fatalf("a 192-byte type is not cut in two: %s", k)
	}
}

// TestLogSegmentKey_FitsTheStores: with type and key of 256 bytes every segment
// is at most 255 bytes and the key fits S3's 1024 for an app of up to 230 bytes;
// past that the key is refused whole, never cut.
func TestLogSegmentKey_FitsTheStores(t *testing.T) {
	typ, key := strings.Repeat("é", 128), strings.Repeat("界", 85)+"x"
	for _, appLen := range []int{4, 64, 191, 192, 230} {
		k := LogSegmentKey(strings.Repeat("a", appLen), typ, key, 1<<63)
		if err := CheckKey(k); err != nil {
			t.Fatalf("app of %d bytes: %v", appLen, err)
		}
	}
	if k := LogSegmentKey("app_"+strings.Repeat("a", 60), typ, key, 0); len(k) != 801 {
		t.Fatalf("64-byte app, 256-byte type and key: %d bytes, want 801", len(k))
	}
	if k := LogSegmentKey(strings.Repeat("a", 231), typ, key, 0); CheckKey(k) == nil {
		t.Fatalf("a %d-byte key passed CheckKey", len(k))
	}
	if k := LogSegmentKey(strings.Repeat("a", 256), typ, key, 0); len(k) != 1059 {
		t.Fatalf("the longest key is %d bytes, want 1059", len(k))
	}
}

// TestLogSegmentKey_Injective: names of every length up to 256 bytes (and past
// it) come back from their key, and an object's prefix is its own: the key of
// no other object starts with it. The pairs include names built to collide if
// the pieces of a long name were not marked: an app cut in two whose second
// piece is another object's type, a type of exactly one piece's length.
func TestLogSegmentKey_Injective(t *testing.T) {
	rng := rand.New(rand.NewSource(2))
	lengths := []int{1, 2, 3, 149, 150, 151, 191, 192, 193, 255, 256, 300, 400}
	type id struct{ app, typ, key string }
	var ids []id
	for range 300 {
		pick := func() string { return nameOf(rng, lengths[rng.Intn(len(lengths))]) }
		ids = append(ids, id{pick(), pick(), pick()})
	}
	// 150 bytes are 200 of base64url, a piece; the concatenation of two names
	// whose first is a multiple of 3 bytes encodes as the two encodings.
	a, b, c := strings.Repeat("a", 150), strings.Repeat("b", 106), strings.Repeat("c", 150)
	ids = append(ids, id{a + b, c, "k"}, id{a, b, c + "k"}, id{"app", a, "k"}, id{"app", a + "k", "z"}, id{"app", "t", a}, id{"app", "t", a + "k"})
	for i, x := range ids {
		k := LogSegmentKey(x.app, x.typ, x.key, uint64(i))
		app, typ, key, first, err := parseLogSegmentKey(k)
		if err != nil || app != x.app || typ != x.typ || key != x.key || first != uint64(i) {
			t.Fatalf("%s: parsed (%q, %q, %q, %d, %v)", k, app, typ, key, first, err)
		}
		for _, seg := range strings.Split(k, "/") {
			if len(seg) > MaxSegmentLen {
				t.Fatalf("%s: a segment of %d bytes", k, len(seg))
			}
		}
		p := LogObjectPrefix(x.app, x.typ, x.key)
		for _, y := range ids {
			if y != x && strings.HasPrefix(LogSegmentKey(y.app, y.typ, y.key, 0), p) {
				t.Fatalf("the prefix of %v holds a segment of %v", x, y)
			}
		}
	}
}
