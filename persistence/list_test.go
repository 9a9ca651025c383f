package persistence

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sort"
	"strings"
	"testing"
)

// TestListObjects_MatchesAModel: objects of two types (and another app) in
// three partitions, with keys of several lengths that share prefixes, each
// holding keys under some behaviour bytes, some deleted again. For random
// queries (prefix, after, limit, marks, a subset of the partitions),
// ListObjects returns exactly what a sort of the model gives: byte order
// across key lengths and partitions, nothing of another type or app, no
// object whose keys are all deleted, none without a mark.
func TestListObjects_MatchesAModel(t *testing.T) {
	db := openTestDB(t, t.TempDir())
	t.Cleanup(func() { _ = db.Close() })
	p := startPipeline(t, db, PipelineConfig{})
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(7, uint64(len(t.Name()))))
	alphabet := "ab\x00\xff"
	randKey := func() string {
		b := make([]byte, 1+rng.IntN(4))
		for i := range b {
			b[i] = alphabet[rng.IntN(len(alphabet))]
		}
		return string(b)
	}
	// model: partition -> key -> behaviour+sub bytes held.
	type obj struct {
		part uint32
		held map[string]bool
	}
	model := map[string]*obj{}
	behaviours := []string{"ks", "kl", "la", "qm", "ar"}
	for range 300 {
		key := randKey()
		o := model[key]
		if o == nil {
			o = &obj{part: uint32(rng.IntN(3)), held: map[string]bool{}}
			model[key] = o
		}
		mark := behaviours[rng.IntN(len(behaviours))]
		id := ObjectID{App: "app", Type: "t", Key: key}
		k := string(ObjectPrefix(o.part, id)) + mark + "x"
		if rng.IntN(4) == 0 && o.held[mark] {
			if err := p.Submit(&Write{Deletes: [][]byte{[]byte(k)}}).Wait(ctx); err != nil {
				t.Fatal(err)
			}
			delete(o.held, mark)
		} else {
			if err := p.Submit(set(k, "v")).Wait(ctx); err != nil {
				t.Fatal(err)
			}
			o.held[mark] = true
		}
		// Noise: the same key in another type, a type that is a prefix
		// of ours, and another app, in the same partition.
		for _, other := range []ObjectID{{App: "app", Type: "tt", Key: key}, {App: "ap", Type: "t", Key: key}, {App: "app", Type: "", Key: key}} {
			if err := p.Submit(set(string(ObjectPrefix(o.part, other))+"ks", "v")).Wait(ctx); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := p.WaitApplied(ctx); err != nil {
		t.Fatal(err)
	}
	markSets := [][]string{nil, {"k"}, {"ks", "qm"}, {"l", "ar"}, {"kl"}}
	for i := range 400 {
		q := ListQuery{App: "app", Type: "t", Limit: 1 + rng.IntN(20)}
		if rng.IntN(2) == 0 {
			k := randKey()
			q.Prefix = k[:rng.IntN(min(len(k), 2)+1)]
		}
		if rng.IntN(2) == 0 {
			q.After = randKey()
		}
		marks := markSets[rng.IntN(len(markSets))]
		for _, m := range marks {
			q.Marks = append(q.Marks, []byte(m))
		}
		parts := []uint32{0, 1, 2}
		if rng.IntN(3) == 0 {
			parts = []uint32{uint32(rng.IntN(3))}
		}
		var want []string
		for key, o := range model {
			if !slices.Contains(parts, o.part) || !strings.HasPrefix(key, q.Prefix) || key <= q.After || len(o.held) == 0 {
				continue
			}
			ok := len(marks) == 0
			for m := range o.held {
				for _, mk := range marks {
					ok = ok || strings.HasPrefix(m, mk)
				}
			}
			if ok {
				want = append(want, key)
			}
		}
		sort.Strings(want)
		want = want[:min(len(want), q.Limit)]
		got, err := db.ListObjects(ctx, parts, q)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(got, want) {
			t.Fatalf("query %d %+v over partitions %v:\n got %q\nwant %q", i, q, parts, got, want)
		}
	}
}

// TestListObjects_ARefusedQuery: a limit below one is an error, not an
// empty page.
func TestListObjects_ARefusedQuery(t *testing.T) {
	db := openTestDB(t, t.TempDir())
	t.Cleanup(func() { _ = db.Close() })
	if _, err := db.ListObjects(context.Background(), []uint32{0}, ListQuery{App: "a", Type: "t"}); err == nil {
		t.Fatal("a listing with limit 0 succeeded")
	}
}

// TestListTypes_DistinctTypesInByteOrder: the types of one app that hold
// any key, merged across partitions and type lengths, with prefix, after
// and limit; another app's types and a type whose keys are all deleted are
// not listed.
func TestListTypes_DistinctTypesInByteOrder(t *testing.T) {
	db := openTestDB(t, t.TempDir())
	t.Cleanup(func() { _ = db.Close() })
	p := startPipeline(t, db, PipelineConfig{})
	ctx := context.Background()
	put := func(part uint32, app, typ, key string) string {
		k := string(ObjectPrefix(part, ObjectID{App: app, Type: typ, Key: key})) + "ks"
		if err := p.Submit(set(k, "v")).Wait(ctx); err != nil {
			t.Fatal(err)
		}
		return k
	}
	put(0, "app", "order", "o1")
	put(1, "app", "order", "o2")
	put(2, "app", "b", "x")
	put(0, "app", "zz", "x")
	put(1, "app", "cart", "c")
	put(2, "other", "secret", "s")
	gone := put(1, "app", "gone", "g")
	if err := p.Submit(&Write{Deletes: [][]byte{[]byte(gone)}}).Wait(ctx); err != nil {
		t.Fatal(err)
	}
	if err := p.WaitApplied(ctx); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		q    ListQuery
		want []string
	}{
		{ListQuery{App: "app", Limit: 10}, []string{"b", "cart", "order", "zz"}},
		{ListQuery{App: "app", Limit: 2}, []string{"b", "cart"}},
		{ListQuery{App: "app", After: "cart", Limit: 10}, []string{"order", "zz"}},
		{ListQuery{App: "app", Prefix: "c", Limit: 10}, []string{"cart"}},
		{ListQuery{App: "other", Limit: 10}, []string{"secret"}},
		{ListQuery{App: "none", Limit: 10}, nil},
	} {
		got, err := db.ListTypes(ctx, []uint32{0, 1, 2}, c.q)
		if err != nil || !slices.Equal(got, c.want) {
			t.Fatalf("%+v: %q %v, want %q", c.q, got, err, c.want)
		}
	}
}

// BenchmarkListObjects_Page: a page of 100 keys of a type of 20,000 objects
// spread over 256 partitions (two key lengths: 512 cursors), each object
// holding a slot and 50 log records (skipped in one seek each).
func BenchmarkListObjects_Page(b *testing.B) {
	const parts = 256
	db, err := Open(Config{Dir: b.TempDir(), Partitions: parts})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = db.Close() })
	p := startPipeline(b, db, PipelineConfig{})
	ctx := context.Background()
	w := &Write{}
	for i := range 20000 {
		id := ObjectID{App: "app", Type: "t", Key: fmt.Sprintf("o%d", i%10000) + strings.Repeat("x", i/10000)}
		obj := string(ObjectPrefix(Partition(id, parts), id))
		w.Sets = append(w.Sets, KV{Key: []byte(obj + "ks"), Value: []byte("1")})
		for r := range 50 {
			w.Sets = append(w.Sets, KV{Key: []byte(fmt.Sprintf("%slb%08d", obj, r)), Value: []byte("record")})
		}
		if len(w.Sets) > 10000 {
			if err := p.Submit(w).Wait(ctx); err != nil {
				b.Fatal(err)
			}
			w = &Write{}
		}
	}
	if err := p.Submit(w).Wait(ctx); err != nil {
		b.Fatal(err)
	}
	if err := p.WaitApplied(ctx); err != nil {
		b.Fatal(err)
	}
	all := make([]uint32, parts)
	for i := range all {
		all[i] = uint32(i)
	}
	marks := [][]byte{[]byte("ks"), []byte("u"), []byte("l"), []byte("q"), []byte("ar")}
	b.ResetTimer()
	after := ""
	for b.Loop() {
		keys, err := db.ListObjects(ctx, all, ListQuery{App: "app", Type: "t", Marks: marks, After: after, Limit: 100})
		if err != nil {
			b.Fatal(err)
		}
		after = "" // past the last page: from the start again
		if len(keys) == 100 {
			after = keys[len(keys)-1]
		}
	}
}
