package persistence

import (
	"bytes"
	"testing"
)

func TestObjectPrefix_PrefixFree(t *testing.T) {
	// Objects whose names concatenate to the same bytes must not share a prefix.
	a := ObjectPrefix(1, ObjectID{"app", "ab", "c"})
	b := ObjectPrefix(1, ObjectID{"app", "a", "bc"})
	c := ObjectPrefix(1, ObjectID{"app", "a", "b"})
	for _, pair := range [][2][]byte{{a, b}, {a, c}, {b, c}} {
		if bytes.HasPrefix(pair[0], pair[1]) || bytes.HasPrefix(pair[1], pair[0]) {
			t.Fatalf("%q and %q overlap", pair[0], pair[1])
		}
	}
	if !bytes.HasPrefix(a, PartitionPrefix(1)) {
		t.Fatal("object prefix does not start with its partition prefix")
	}
}

func TestKeyspace_Suffix(t *testing.T) {
	ks := NewKeyspace(3, ObjectID{"a", "t", "k"}, 'k')
	k := ks.KeyString('s', "slot")
	if got := ks.Suffix('s', k); string(got) != "slot" {
		t.Fatalf("suffix = %q", got)
	}
	if ks.Suffix('l', k) != nil {
		t.Fatal("suffix under another sub-key")
	}
	other := NewKeyspace(3, ObjectID{"a", "t", "k2"}, 'k')
	if ks.Suffix('s', other.KeyString('s', "slot")) != nil {
		t.Fatal("suffix of another object's key")
	}
	if !bytes.Equal(ks.KeyUint64('l', 1)[:len(ks.Prefix())], ks.Prefix()) {
		t.Fatal("uint64 key outside the keyspace")
	}
}

func TestPartition_StableAndInRange(t *testing.T) {
	id := ObjectID{"app_1", "order", "order-42"}
	p := Partition(id, 256)
	if p >= 256 || p != Partition(id, 256) {
		t.Fatalf("partition %d", p)
	}
	// Fixed forever: a change would move data of existing directories.
	if got := Partition(ObjectID{"a", "b", "c"}, 1<<16); got != Partition(ObjectID{"a", "b", "c"}, 1<<16) {
		t.Fatal("unstable")
	}
}

func TestObjectIDEncoding(t *testing.T) {
	id := ObjectID{App: "app", Type: "", Key: "k/ü"}
	b := AppendObjectID([]byte("x"), id)
	got, rest, ok := DecodeObjectID(append(b[1:], "tail"...))
	if !ok || got != id || string(rest) != "tail" {
		t.Fatalf("decoded %+v %q %v", got, rest, ok)
	}
	if string(ObjectPrefix(7, id)[3:]) != string(b[1:]) {
		t.Fatal("the object prefix does not use the same encoding")
	}
	for n := range len(b) - 1 {
		if _, _, ok := DecodeObjectID(b[1 : 1+n]); ok {
			t.Fatalf("a truncated encoding of %d bytes decoded", n)
		}
	}
}
