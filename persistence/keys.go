package persistence

import (
	"encoding/binary"
	"fmt"

	"github.com/cespare/xxhash/v2"
)

// ObjectID names a durable object.
type ObjectID struct {
	App  string
	Type string
	Key  string
}

func (id ObjectID) String() string { return id.App + "/" + id.Type + "/" + id.Key }

// An object's keyspace is divided by a behaviour byte (NewKeyspace), and a
// partition's node-level indexes by an index kind (PartitionIndexPrefix). Which
// bytes exist, and what they hold, is the business of the layers above
// (actors/keys.go keeps the list); persistence knows only the layout.

// PartitionIndexPrefix is the prefix of partition p's index of the given kind:
// a node-level index of one partition (for example the alarm index), kept under
// the partition's prefix so that a partition is still scanned, copied or
// dropped by prefix. Indexes sit after every object of the partition: an
// object prefix continues with the 16-bit length of its app name, and no app
// name is 0xFFxx bytes long.
func PartitionIndexPrefix(p uint32, kind byte) []byte {
	return []byte{prefixPartition, byte(p >> 8), byte(p), 0xFF, 0xFF, kind}
}

const (
	prefixMeta      byte = 'm'
	prefixPartition byte = 'p'
)

// Partition returns the partition of id among n partitions. The hash is fixed
// forever: changing it would move every object of every existing data directory.
func Partition(id ObjectID, n int) uint32 {
	d := xxhash.New()
	_, _ = d.WriteString(id.App)
	_, _ = d.Write([]byte{0})
	_, _ = d.WriteString(id.Type)
	_, _ = d.Write([]byte{0})
	_, _ = d.WriteString(id.Key)
	return uint32(d.Sum64() % uint64(n))
}

// PartitionPrefix is the prefix of every key of every object in partition p.
func PartitionPrefix(p uint32) []byte {
	return []byte{prefixPartition, byte(p >> 8), byte(p)}
}

// ObjectPrefix is the prefix of every key of the object id in partition p.
// It panics if a part is longer than 65535 bytes; callers validate names first.
func ObjectPrefix(p uint32, id ObjectID) []byte {
	b := make([]byte, 0, 3+6+len(id.App)+len(id.Type)+len(id.Key)+1)
	return AppendObjectID(append(b, PartitionPrefix(p)...), id)
}

// AppendObjectID appends id's encoding in keys: each of app, type and key as
// its 16-bit length and its bytes. It panics if a part is longer than 65535
// bytes; callers validate names first.
func AppendObjectID(b []byte, id ObjectID) []byte {
	for _, s := range [...]string{id.App, id.Type, id.Key} {
		if len(s) > 0xFFFF {
			panic(fmt.Sprintf("persistence: object name part of %d bytes", len(s)))
		}
		b = binary.BigEndian.AppendUint16(b, uint16(len(s)))
		b = append(b, s...)
	}
	return b
}

// DecodeObjectID decodes an AppendObjectID encoding at the start of b and
// returns what follows it.
func DecodeObjectID(b []byte) (id ObjectID, rest []byte, ok bool) {
	var parts [3]string
	for i := range parts {
		if len(b) < 2 {
			return ObjectID{}, nil, false
		}
		n := int(binary.BigEndian.Uint16(b))
		if len(b) < 2+n {
			return ObjectID{}, nil, false
		}
		parts[i], b = string(b[2:2+n]), b[2+n:]
	}
	return ObjectID{App: parts[0], Type: parts[1], Key: parts[2]}, b, true
}

// Keyspace is one behaviour of one object: every key it builds starts with Prefix.
type Keyspace struct {
	prefix []byte
}

// NewKeyspace returns the keyspace of behaviour b of object id in partition p.
func NewKeyspace(p uint32, id ObjectID, b byte) Keyspace {
	return Keyspace{prefix: append(ObjectPrefix(p, id), b)}
}

// Prefix returns the prefix shared by every key of the keyspace. Do not modify it.
func (k Keyspace) Prefix() []byte { return k.prefix }

// Key returns prefix | sub | suffix as a new slice.
func (k Keyspace) Key(sub byte, suffix []byte) []byte {
	b := make([]byte, 0, len(k.prefix)+1+len(suffix))
	b = append(b, k.prefix...)
	b = append(b, sub)
	return append(b, suffix...)
}

// KeyString is Key with a string suffix.
func (k Keyspace) KeyString(sub byte, suffix string) []byte {
	b := make([]byte, 0, len(k.prefix)+1+len(suffix))
	b = append(b, k.prefix...)
	b = append(b, sub)
	return append(b, suffix...)
}

// KeyUint64 is Key with a big-endian uint64 suffix, so keys sort by number.
func (k Keyspace) KeyUint64(sub byte, n uint64) []byte {
	b := make([]byte, 0, len(k.prefix)+9)
	b = append(b, k.prefix...)
	b = append(b, sub)
	return binary.BigEndian.AppendUint64(b, n)
}

// Suffix returns the part of key after prefix | sub, or nil if key is not in it.
func (k Keyspace) Suffix(sub byte, key []byte) []byte {
	n := len(k.prefix) + 1
	if len(key) < n || key[n-1] != sub || string(key[:n-1]) != string(k.prefix) {
		return nil
	}
	return key[n:]
}

func metaKey(name string) []byte { return append([]byte{prefixMeta}, name...) }
