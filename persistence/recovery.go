package persistence

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
)

// Recovery is strict, as etcd's WAL is: replay stops the start-up at anything
// it cannot explain, with the file and offset, and never skips a record.
//
// What replay accepts, segment by segment in id order:
//   - records whose CRC checks out, each one's seq exactly one above the one
//     before it (the pipeline numbers its commits without gaps), the first one
//     of the log at most one above Badger's newest version (the records before
//     it were released once Badger held them);
//   - a segment ends at a zero length (the end marker rotation writes, or the
//     zeros a new segment is pre-filled with) or where too few bytes are left
//     for a header; nothing after that end may be a record of this segment;
//   - only the NEWEST segment may end in a record that does not check out: the
//     write that a crash cut short. It is dropped (its header is zeroed and
//     synced, so that the segment ends there from now on), and only if no
//     record of the segment follows it: a bad record with a good one after it
//     is damage, not a torn write.
//
// Everything else (a bad CRC in an older segment, a good record after a bad
// one, a gap or a step back in the sequence, a record whose changes do not
// decode, a log that starts beyond Badger) stops Open with a *CorruptionError.
// So does a raft change that does not continue its replica's log (raftlog.go:
// a gap, an entry below the first index, a term or HardState term going down,
// a commit past the last index, a state record that disagrees with the log
// before it, an entry of the log in no retained segment), with the group,
// replica and index.
// `holdfast repair wal --accept-data-loss` (RepairWAL) truncates the log at the
// first such point on purpose.

// ErrCorrupt is what a *CorruptionError matches with errors.Is.
var ErrCorrupt = errors.New("persistence: the write-ahead log is damaged")

// CorruptionError says where the write-ahead log stopped making sense.
type CorruptionError struct {
	File    string // the segment's path
	Segment uint64 // its id
	Offset  int64  // the offset of the record (or end marker) that fails
	Seq     uint64 // the seq that record claims, if it was readable; 0 if not
	After   uint64 // the seq of the last good record before it (0: none)
	Reason  string
	// Group, Replica and Index name the raft log that stopped making sense
	// (a gap, a term going down, ...); zero for damage that is not a raft
	// log's. The Reason says them too.
	Group, Replica, Index uint64
	// missingStart: the log's first record is beyond what the database holds
	// (RepairWAL cannot cut that away; it can only replay the log as it is).
	missingStart bool
}

func (e *CorruptionError) Error() string {
	s := fmt.Sprintf("persistence: the write-ahead log is damaged in %s at offset %d: %s", e.File, e.Offset, e.Reason)
	if e.After > 0 {
		s += fmt.Sprintf(" (the last good record before it is seq %d)", e.After)
	}
	return s + "; start-up stopped so that nothing acknowledged is silently lost. " +
		"`holdfast repair wal --data-dir DIR --accept-data-loss` truncates the log there, dropping what follows"
}

// Is makes errors.Is(err, ErrCorrupt) true.
func (e *CorruptionError) Is(target error) bool { return target == ErrCorrupt }

// segmentScan is what scanSegment found in one segment.
type segmentScan struct {
	end     int64  // offset after the last good record: where the segment ends
	lastSeq uint64 // seq of its last good record, 0 if none
	records int
	// torn is set when the newest segment ended in a record that does not
	// check out and that no good record follows: a write a crash cut short.
	torn bool
	// damage is set when the segment holds something replay cannot explain.
	damage *CorruptionError
}

// scanSegment checks the records of segment id (its bytes in data) and calls
// apply for each good one, in order. last is the seq of the log's last good
// record before this segment (0 if none), or, before the first record of the
// log, floor: the newest version Badger holds. newest says whether this is the
// log's newest segment, the only one whose last record may be torn. It stops at
// the first damage and reports it in the result; apply's own error is returned
// as is.
func scanSegment(path string, id uint64, data []byte, last, floor uint64, newest bool, apply func(seq uint64, off int64, payload []byte) error) (segmentScan, error) {
	sc := segmentScan{}
	damage := func(off int64, seq uint64, reason string) *CorruptionError {
		return &CorruptionError{File: path, Segment: id, Offset: off, Seq: seq, After: last, Reason: reason}
	}
	size := int64(len(data))
	var off int64
	for {
		if off+recordHeader > size {
			break // the file ends: too few bytes for another record
		}
		hdr := data[off : off+recordHeader]
		n := int64(binary.LittleEndian.Uint32(hdr))
		seq := binary.LittleEndian.Uint64(hdr[8:])
		if n == 0 {
			break // the end marker, or the zeros after the last record
		}
		if off+recordHeader+n > size || recordCRC(id, hdr, data[off+recordHeader:off+recordHeader+n]) != binary.LittleEndian.Uint32(hdr[4:]) {
			if goodOff, goodSeq, ok := goodRecordAfter(id, data, off+1, last); ok {
				sc.damage = damage(off, 0, fmt.Sprintf("a record that fails its checksum, with a good record (seq %d) after it at offset %d", goodSeq, goodOff))
				break
			}
			if !newest {
				sc.damage = damage(off, 0, "a record that fails its checksum in a segment that is not the newest (only the newest segment's last write can be torn)")
				break
			}
			sc.torn = true
			break
		}
		switch {
		case last == 0 && seq > floor+1:
			sc.damage = damage(off, seq, fmt.Sprintf("the log starts at seq %d but the database holds versions only up to %d: records %d..%d are missing", seq, floor, floor+1, seq-1))
			sc.damage.missingStart = true
		case last != 0 && seq <= last:
			sc.damage = damage(off, seq, fmt.Sprintf("seq %d steps back (it follows seq %d)", seq, last))
		case last != 0 && seq != last+1:
			sc.damage = damage(off, seq, fmt.Sprintf("a gap in the sequence: seq %d follows seq %d (records %d..%d are missing)", seq, last, last+1, seq-1))
		}
		if sc.damage != nil {
			break
		}
		if err := apply(seq, off, data[off+recordHeader:off+recordHeader+n]); err != nil {
			var re *raftReplayError
			if errors.As(err, &re) {
				sc.damage = damage(off, seq, fmt.Sprintf("record seq %d: %s", seq, re.Error()))
				sc.damage.Group, sc.damage.Replica, sc.damage.Index = re.key.group, re.key.replica, re.index
				break
			}
			if errors.Is(err, errCorrupt) {
				sc.damage = damage(off, seq, fmt.Sprintf("record seq %d passes its checksum but its changes do not decode", seq))
				break
			}
			return sc, err
		}
		last = seq
		sc.lastSeq = seq
		sc.records++
		off += recordHeader + n
	}
	sc.end = off
	if sc.damage == nil && !sc.torn && off+recordHeader <= size {
		// The segment ended at a zero length: nothing of it may follow.
		if goodOff, goodSeq, ok := goodRecordAfter(id, data, off+1, last); ok {
			sc.damage = damage(off, 0, fmt.Sprintf("the segment ends here (a zero length), but a good record (seq %d) follows at offset %d", goodSeq, goodOff))
		}
	}
	return sc, nil
}

// goodRecordAfter looks, at every offset from from on, for a record of segment
// id that checks out and whose seq is above last: proof that what came before
// it is damage, not the end of what was written. Records a recycled segment
// kept from its earlier life never check out (their CRC mixes in another id).
// Only offsets whose header claims a plausible seq pay for a CRC.
func goodRecordAfter(id uint64, data []byte, from int64, last uint64) (int64, uint64, bool) {
	size := int64(len(data))
	for off := from; off+recordHeader <= size; off++ {
		n := int64(binary.LittleEndian.Uint32(data[off:]))
		if n == 0 || off+recordHeader+n > size {
			continue
		}
		seq := binary.LittleEndian.Uint64(data[off+8:])
		if seq <= last || seq-last > maxSeqJump {
			continue
		}
		hdr := data[off : off+recordHeader]
		if recordCRC(id, hdr, data[off+recordHeader:off+recordHeader+n]) == binary.LittleEndian.Uint32(hdr[4:]) {
			return off, seq, true
		}
	}
	return 0, 0, false
}

// maxSeqJump bounds how far above the last good seq goodRecordAfter looks: a
// segment holds far fewer records than this.
const maxSeqJump = 1 << 32

// readSegment reads a whole segment file.
func readSegment(seg *segment) ([]byte, error) {
	st, err := seg.f.Stat()
	if err != nil {
		return nil, err
	}
	data := make([]byte, st.Size())
	if _, err := seg.f.ReadAt(data, 0); err != nil && !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("read log segment %s: %w", seg.path, err)
	}
	return data, nil
}
