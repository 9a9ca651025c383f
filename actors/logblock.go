package actors

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
)

// Blocks of the retained log (log.go): the records of one append, stored
// under one key, and their encoding.
// block is one decoded block: records first, first+1, ... appended at `at`.

type block struct {
	first  uint64
	at     int64
	cumEnd uint64 // payload bytes appended up to the block's end
	recs   []blockRecord
}

type blockRecord struct {
	flags byte
	key   string
	body  []byte
}

func (b *block) end() uint64 { return b.first + uint64(len(b.recs)) }

// encodeBlock is version | appendedAt (u64 BE) | cumEnd (u64 BE) | uvarint count,
// then per record: flags | uvarint key length | key | uvarint body length | body.
func encodeBlock(b *block) []byte {
	n := 1 + 8 + 8 + binary.MaxVarintLen64
	for _, r := range b.recs {
		n += 1 + 2*binary.MaxVarintLen64 + len(r.key) + len(r.body)
	}
	out := make([]byte, 0, n)
	out = append(out, logBlockVersion)
	out = binary.BigEndian.AppendUint64(out, uint64(b.at))
	out = binary.BigEndian.AppendUint64(out, b.cumEnd)
	out = binary.AppendUvarint(out, uint64(len(b.recs)))
	for _, r := range b.recs {
		out = append(out, r.flags)
		out = binary.AppendUvarint(out, uint64(len(r.key)))
		out = append(out, r.key...)
		out = binary.AppendUvarint(out, uint64(len(r.body)))
		out = append(out, r.body...)
	}
	return out
}

// blockCount reads a stored block's record count and returns the rest of it.
func blockCount(v []byte) (count uint64, rest []byte, ok bool) {
	if len(v) < 18 || v[0] != logBlockVersion {
		return 0, nil, false
	}
	count, used := binary.Uvarint(v[17:])
	if used <= 0 || count > uint64(len(v)) {
		return 0, nil, false
	}
	return count, v[17+used:], true
}

// decodeBlock decodes a stored block; the records' bytes are copied.
func decodeBlock(first uint64, v []byte) (*block, error) {
	bad := func(what string) error { return fmt.Errorf("log block %d: bad %s", first, what) }
	count, rest, ok := blockCount(v)
	if !ok {
		return nil, bad("header")
	}
	b := &block{first: first, at: int64(binary.BigEndian.Uint64(v[1:])), cumEnd: binary.BigEndian.Uint64(v[9:])}
	v = rest
	next := func() ([]byte, bool) {
		n, used := binary.Uvarint(v)
		if used <= 0 || uint64(len(v)-used) < n {
			return nil, false
		}
		out := v[used : used+int(n)]
		v = v[used+int(n):]
		return out, true
	}
	b.recs = make([]blockRecord, count)
	for i := range b.recs {
		if len(v) < 1 {
			return nil, bad("record")
		}
		b.recs[i].flags = v[0]
		v = v[1:]
		key, ok := next()
		body, ok2 := next()
		if !ok || !ok2 {
			return nil, bad("record")
		}
		b.recs[i].key = string(key)
		b.recs[i].body = append([]byte(nil), body...)
	}
	return b, nil
}

func (b *block) record(i int) LogRecord {
	r := b.recs[i]
	return LogRecord{Offset: b.first + uint64(i), Body: json.RawMessage(r.body), DeduplicationKey: r.key, AppendedAt: b.at}
}
