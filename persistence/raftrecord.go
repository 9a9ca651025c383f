package persistence

import (
	"encoding/binary"
)

// The raft changes of a log record (docs/replication-design.md, 1.5). A record's
// payload may hold, beside the local changes (ops 1-3), the raft log of any
// number of replicas:
//
//	op 4  raft block  group | replica | flags (1 byte)
//	                  [term | vote | commit]                            if flags&1 (HardState)
//	                  [count | count x (index | term | type | len | data)] if flags&2 (entries)
//	op 5  truncate    group | replica | first index kept | term of first-1 | conf
//	op 6  state       count | count x (group | replica | term | vote | commit |
//	                  first | term of first-1 | last | term of last | conf | snap)
//	op 8  snapshot    raftsnapshot.go
//
// conf is the replica's configuration as of first-1 (a marshalled
// raftpb.ConfState): its length + 1 and its bytes, or 0 when the log has
// none (a truncation that keeps the one before). snap is the staged
// snapshot the log's restart point still needs (raftsnapshot.go): its id, 0
// for none, then its size and chunk count. A replica restarts from
// first-1 with it (replication.WALPipeline): raft's snapshot metadata, with
// no snapshot data (Badger has it). A truncation carries the term of first-1
// because replay may not know it: an entry known only from the state record
// a segment starts with, whose own record was in a segment released since,
// has no term of its own (a power-cut test found replay guessing 0).
//
// Every number is a uvarint. A block's entries are consecutive (index+1 each)
// with terms that never go down; entry data is the raft entry's bytes as is
// (a follower logs the leader's bytes). flags&4 (a snapshot header, design
// step 6) is not written yet and does not decode.
//
// Op 6 is the first change of the first record of every segment a node with
// raft state writes: every replica's HardState and log bounds as the log held
// them before that record. Replay starting at that segment (the older ones
// were released) knows each log from it, and the older segments' HardStates
// and truncations are superseded. It carries the last index and its term too,
// beyond the design's list: the entries between first and last may sit in
// released segments only when a later truncation drops them, and replay needs
// the last index to check that the log continues (raftIndex.finishReplay).
const (
	opRaftBlock    byte = 4
	opRaftTruncate byte = 5
	opRaftState    byte = 6
)

const (
	raftFlagHardState byte = 1
	raftFlagEntries   byte = 2
	raftFlagsKnown         = raftFlagHardState | raftFlagEntries
)

// raftMaxEntryType is the highest raftpb.EntryType (EntryConfChangeV2).
const raftMaxEntryType = 2

// raftKey names one replica's log: a group (partition) and the replica's raft id.
type raftKey struct{ group, replica uint64 }

// hardState is raftpb.HardState by value.
type hardState struct{ term, vote, commit uint64 }

// raftEntry is one decoded (or to be encoded) entry; data aliases the payload.
type raftEntry struct {
	index, term uint64
	typ         uint8
	data        []byte
	dataOff     int // offset of data in the payload (decoded only)
}

// raftBlock is one op 4 change.
type raftBlock struct {
	key   raftKey
	hs    hardState
	hasHS bool
	ents  []raftEntry
}

// replicaState is one replica of an op 6 change.
type replicaState struct {
	key             raftKey
	hs              hardState
	first, prevTerm uint64 // first index kept, the term of first-1
	last, lastTerm  uint64
	conf            logConf
	snap            snapRef
}

// logConf is a replica's configuration as of its first index - 1 (a
// marshalled raftpb.ConfState), if its log has one. A string, so that
// replicaState stays comparable.
type logConf struct {
	set bool
	cs  string
}

func appendConf(p []byte, c logConf) []byte {
	if !c.set {
		return binary.AppendUvarint(p, 0)
	}
	p = binary.AppendUvarint(p, uint64(len(c.cs))+1)
	return append(p, c.cs...)
}

// appendRaftBlock appends b as an op 4 change, and sets each entry's dataOff
// to where its data is in p.
func appendRaftBlock(p []byte, b *raftBlock) []byte {
	p = append(p, opRaftBlock)
	p = binary.AppendUvarint(p, b.key.group)
	p = binary.AppendUvarint(p, b.key.replica)
	var flags byte
	if b.hasHS {
		flags |= raftFlagHardState
	}
	if len(b.ents) > 0 {
		flags |= raftFlagEntries
	}
	p = append(p, flags)
	if b.hasHS {
		p = binary.AppendUvarint(p, b.hs.term)
		p = binary.AppendUvarint(p, b.hs.vote)
		p = binary.AppendUvarint(p, b.hs.commit)
	}
	if len(b.ents) > 0 {
		p = binary.AppendUvarint(p, uint64(len(b.ents)))
		for i := range b.ents {
			e := &b.ents[i]
			p = binary.AppendUvarint(p, e.index)
			p = binary.AppendUvarint(p, e.term)
			p = binary.AppendUvarint(p, uint64(e.typ))
			p = binary.AppendUvarint(p, uint64(len(e.data)))
			e.dataOff = len(p)
			p = append(p, e.data...)
		}
	}
	return p
}

// raftTruncation is one op 5 change: k's log starts at first; entry first-1
// has term prevTerm; conf is the configuration as of first-1 (unset: the
// one the log had).
type raftTruncation struct {
	key             raftKey
	first, prevTerm uint64
	conf            logConf
}

// appendRaftTruncate appends t as an op 5 change.
func appendRaftTruncate(p []byte, t raftTruncation) []byte {
	p = append(p, opRaftTruncate)
	p = binary.AppendUvarint(p, t.key.group)
	p = binary.AppendUvarint(p, t.key.replica)
	p = binary.AppendUvarint(p, t.first)
	p = binary.AppendUvarint(p, t.prevTerm)
	return appendConf(p, t.conf)
}

// appendRaftState appends an op 6 change holding states.
func appendRaftState(p []byte, states []replicaState) []byte {
	p = append(p, opRaftState)
	p = binary.AppendUvarint(p, uint64(len(states)))
	for i := range states {
		s := &states[i]
		for _, v := range [...]uint64{s.key.group, s.key.replica, s.hs.term, s.hs.vote, s.hs.commit, s.first, s.prevTerm, s.last, s.lastTerm} {
			p = binary.AppendUvarint(p, v)
		}
		p = appendConf(p, s.conf)
		p = appendSnapRef(p, s.snap)
	}
	return p
}

// raftDecoder reads ops 4-6 from a payload. pos is the offset of the next
// byte in the payload.
type raftDecoder struct {
	p   []byte
	pos int
}

func (d *raftDecoder) uvarint() (uint64, error) {
	n, used := binary.Uvarint(d.p[d.pos:])
	if used <= 0 {
		return 0, errCorrupt
	}
	d.pos += used
	return n, nil
}

func (d *raftDecoder) key() (raftKey, error) {
	g, err := d.uvarint()
	if err != nil {
		return raftKey{}, err
	}
	r, err := d.uvarint()
	if err != nil {
		return raftKey{}, err
	}
	if r == 0 {
		return raftKey{}, errCorrupt // raft ids start at 1
	}
	return raftKey{g, r}, nil
}

// block decodes the body of an op 4 change (after the op byte) into b,
// reusing b.ents. Its checks are the ones a single block can fail: unknown
// flags, an empty block, entries that are not consecutive or whose terms go
// down, index or term 0, an unknown entry type, data past the payload.
func (d *raftDecoder) block(b *raftBlock) error {
	var err error
	if b.key, err = d.key(); err != nil {
		return err
	}
	if d.pos >= len(d.p) {
		return errCorrupt
	}
	flags := d.p[d.pos]
	d.pos++
	if flags == 0 || flags&^raftFlagsKnown != 0 {
		return errCorrupt
	}
	b.hasHS = flags&raftFlagHardState != 0
	b.hs = hardState{}
	if b.hasHS {
		for _, v := range []*uint64{&b.hs.term, &b.hs.vote, &b.hs.commit} {
			if *v, err = d.uvarint(); err != nil {
				return err
			}
		}
	}
	b.ents = b.ents[:0]
	if flags&raftFlagEntries == 0 {
		return nil
	}
	n, err := d.uvarint()
	if err != nil {
		return err
	}
	// Each entry takes at least 4 bytes: a bound before allocating for n.
	if n == 0 || n > uint64(len(d.p)-d.pos)/4 {
		return errCorrupt
	}
	for i := uint64(0); i < n; i++ {
		var e raftEntry
		var typ, size uint64
		for _, v := range []*uint64{&e.index, &e.term, &typ, &size} {
			if *v, err = d.uvarint(); err != nil {
				return err
			}
		}
		if e.index == 0 || e.term == 0 || typ > raftMaxEntryType || size > uint64(len(d.p)-d.pos) {
			return errCorrupt
		}
		if i > 0 {
			prev := &b.ents[len(b.ents)-1]
			if e.index != prev.index+1 || e.term < prev.term {
				return errCorrupt
			}
		}
		e.typ = uint8(typ)
		e.dataOff = d.pos
		e.data = d.p[d.pos : d.pos+int(size) : d.pos+int(size)]
		d.pos += int(size)
		b.ents = append(b.ents, e)
	}
	return nil
}

// conf decodes a conf (appendConf).
func (d *raftDecoder) conf() (logConf, error) {
	n, err := d.uvarint()
	if err != nil {
		return logConf{}, err
	}
	if n == 0 {
		return logConf{}, nil
	}
	if n-1 > uint64(len(d.p)-d.pos) {
		return logConf{}, errCorrupt
	}
	c := logConf{set: true, cs: string(d.p[d.pos : d.pos+int(n-1)])}
	d.pos += int(n - 1)
	return c, nil
}

// truncate decodes the body of an op 5 change.
func (d *raftDecoder) truncate() (raftTruncation, error) {
	var t raftTruncation
	var err error
	if t.key, err = d.key(); err != nil {
		return t, err
	}
	if t.first, err = d.uvarint(); err != nil || t.first == 0 {
		return t, errCorrupt
	}
	if t.prevTerm, err = d.uvarint(); err != nil || (t.first == 1) != (t.prevTerm == 0) {
		return t, errCorrupt // entry 0 has term 0, and only it
	}
	t.conf, err = d.conf()
	return t, err
}

// state decodes the body of an op 6 change, appending to states. Each
// replica's numbers must make a log: first >= 1, last >= first-1, terms that
// do not go down from first-1 to last, a commit not past last.
func (d *raftDecoder) state(states []replicaState) ([]replicaState, error) {
	n, err := d.uvarint()
	if err != nil {
		return states, err
	}
	if n == 0 || n > uint64(len(d.p)-d.pos)/10 {
		return states, errCorrupt
	}
	for i := uint64(0); i < n; i++ {
		var s replicaState
		if s.key, err = d.key(); err != nil {
			return states, err
		}
		for _, v := range []*uint64{&s.hs.term, &s.hs.vote, &s.hs.commit, &s.first, &s.prevTerm, &s.last, &s.lastTerm} {
			if *v, err = d.uvarint(); err != nil {
				return states, err
			}
		}
		if s.conf, err = d.conf(); err != nil {
			return states, err
		}
		if s.snap, err = d.snapRef(); err != nil {
			return states, err
		}
		if s.first == 0 || s.last+1 < s.first || s.lastTerm < s.prevTerm || s.hs.commit > s.last ||
			(s.last+1 == s.first && s.lastTerm != s.prevTerm) || (s.snap.id != 0 && !s.conf.set) {
			return states, errCorrupt
		}
		states = append(states, s)
	}
	return states, nil
}
