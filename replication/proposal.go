package replication

import (
	"encoding/binary"
	"fmt"
)

// entryVersion is the first byte of every proposal entry we write. An entry
// with empty data (a new leader's no-op) carries no header.
const entryVersion = 1

// Header identifies a proposal inside its entry: the replica that proposed it,
// that replica's incarnation (its engine's start), and a number unique within
// the incarnation. The proposer matches its pending proposals by it at apply;
// nobody else reads it.
type Header struct {
	Proposer    ReplicaID
	Incarnation uint64
	Seq         uint64
}

// maxHeaderLen bounds an encoded header: a version byte and three uvarints.
const maxHeaderLen = 1 + 3*binary.MaxVarintLen64

// appendEntry appends the encoding of (h, payload) to dst:
// version (1 byte) | proposer (uvarint) | incarnation (uvarint) | seq (uvarint) | payload.
func appendEntry(dst []byte, h Header, payload []byte) []byte {
	dst = append(dst, entryVersion)
	dst = binary.AppendUvarint(dst, uint64(h.Proposer))
	dst = binary.AppendUvarint(dst, h.Incarnation)
	dst = binary.AppendUvarint(dst, h.Seq)
	return append(dst, payload...)
}

// DecodeEntry splits a normal entry's data into its header and the payload
// given to Propose. ok is false for an entry without data (a leader's no-op).
// The payload aliases data.
func DecodeEntry(data []byte) (h Header, payload []byte, ok bool, err error) {
	if len(data) == 0 {
		return Header{}, nil, false, nil
	}
	if data[0] != entryVersion {
		return Header{}, nil, false, fmt.Errorf("%w: version %d", ErrBadEntry, data[0])
	}
	rest := data[1:]
	var vals [3]uint64
	for i := range vals {
		v, n := binary.Uvarint(rest)
		if n <= 0 {
			return Header{}, nil, false, fmt.Errorf("%w: truncated header", ErrBadEntry)
		}
		vals[i], rest = v, rest[n:]
	}
	return Header{Proposer: ReplicaID(vals[0]), Incarnation: vals[1], Seq: vals[2]}, rest, true, nil
}
