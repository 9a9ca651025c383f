package persistence

import (
	"bytes"
	"encoding/binary"
	"errors"
	"reflect"
	"testing"
)

// decodeAll decodes every change of payload: local ones into sets (key=value
// strings) and raft ones into the returned slices.
func decodeAll(payload []byte) (sets []string, blocks []raftBlock, truncs [][2]uint64, states [][]replicaState, err error) {
	err = decodeRecord(payload,
		func(k, v []byte) error { sets = append(sets, string(k)+"="+string(v)); return nil },
		func(k []byte) error { sets = append(sets, "-"+string(k)); return nil },
		func(d *raftDecoder, op byte) error {
			switch op {
			case opRaftBlock:
				var b raftBlock
				if err := d.block(&b); err != nil {
					return err
				}
				blocks = append(blocks, b)
			case opRaftTruncate:
				tr, err := d.truncate()
				if err != nil {
					return err
				}
				truncs = append(truncs, [2]uint64{tr.key.group<<32 | tr.key.replica, tr.first})
			case opRaftState:
				s, err := d.state(nil)
				if err != nil {
					return err
				}
				states = append(states, s)
			}
			return nil
		})
	return
}

func ents(from uint64, terms ...uint64) []raftEntry {
	var out []raftEntry
	for i, t := range terms {
		idx := from + uint64(i)
		out = append(out, raftEntry{index: idx, term: t, data: []byte{byte(idx), byte(idx >> 8), 'e'}})
	}
	return out
}

func TestRaftRecord_RoundTripsBesideLocalChanges(t *testing.T) {
	hsOnly := raftBlock{key: raftKey{7, 1}, hs: hardState{3, 2, 5}, hasHS: true}
	entsOnly := raftBlock{key: raftKey{300, 2}, ents: ents(6, 3, 3, 4)}
	entsOnly.ents[1].typ = 2
	entsOnly.ents[2].data = nil // an empty entry (a new leader's)
	both := raftBlock{key: raftKey{0, 9}, hs: hardState{4, 9, 8}, hasHS: true, ents: ents(9, 4)}
	states := []replicaState{
		{key: raftKey{7, 1}, hs: hardState{3, 2, 5}, first: 1, prevTerm: 0, last: 8, lastTerm: 3},
		{key: raftKey{300, 2}, first: 11, prevTerm: 4, last: 10, lastTerm: 4},
	}
	p := appendRaftState(nil, states)
	p = appendWrite(p, set("k", "v"))
	p = appendRaftBlock(p, &hsOnly)
	p = appendRaftBlock(p, &entsOnly)
	p = appendRaftTruncate(p, raftTruncation{key: raftKey{7, 1}, first: 4, prevTerm: 1})
	p = appendWrite(p, &Write{Deletes: [][]byte{[]byte("gone")}})
	p = appendRaftBlock(p, &both)

	sets, blocks, truncs, gotStates, err := decodeAll(p)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"k=v", "-gone"}; !reflect.DeepEqual(sets, want) {
		t.Fatalf("local changes %v, want %v", sets, want)
	}
	if len(gotStates) != 1 || !reflect.DeepEqual(gotStates[0], states) {
		t.Fatalf("states %+v, want %+v", gotStates, states)
	}
	if want := [][2]uint64{{7<<32 | 1, 4}}; !reflect.DeepEqual(truncs, want) {
		t.Fatalf("truncations %v, want %v", truncs, want)
	}
	want := []raftBlock{hsOnly, entsOnly, both}
	if len(blocks) != len(want) {
		t.Fatalf("%d blocks, want %d", len(blocks), len(want))
	}
	for i, b := range blocks {
		w := want[i]
		if b.key != w.key || b.hasHS != w.hasHS || b.hs != w.hs || len(b.ents) != len(w.ents) {
			t.Fatalf("block %d: %+v, want %+v", i, b, w)
		}
		for j, e := range b.ents {
			we := w.ents[j]
			if e.index != we.index || e.term != we.term || e.typ != we.typ || !bytes.Equal(e.data, we.data) {
				t.Fatalf("block %d entry %d: %+v, want %+v", i, j, e, we)
			}
			// dataOff is where the encoder put the data, and the decoder finds it there.
			if e.dataOff != we.dataOff || !bytes.Equal(p[e.dataOff:e.dataOff+len(e.data)], we.data) {
				t.Fatalf("block %d entry %d: data at %d, encoded at %d", i, j, e.dataOff, we.dataOff)
			}
		}
	}
}

func TestRaftRecord_DecoderRefusesWhatWasNeverWritten(t *testing.T) {
	uv := binary.AppendUvarint
	block := func(flags byte, body ...[]byte) []byte {
		p := []byte{opRaftBlock, 1, 1, flags}
		for _, b := range body {
			p = append(p, b...)
		}
		return p
	}
	entry := func(index, term, typ uint64, data string) []byte {
		b := uv(uv(uv(uv(nil, index), term), typ), uint64(len(data)))
		return append(b, data...)
	}
	good := block(raftFlagEntries, []byte{2}, entry(1, 1, 0, "ab"), entry(2, 1, 0, "c"))
	if _, blocks, _, _, err := decodeAll(good); err != nil || len(blocks) != 1 {
		t.Fatalf("the well-formed block: %v", err)
	}
	for name, p := range map[string][]byte{
		"no flags":               block(0),
		"a snapshot (step 6)":    block(4, []byte{1, 1, 1}),
		"an unknown flag":        block(raftFlagHardState|8, []byte{1, 1, 1}),
		"zero entries":           block(raftFlagEntries, []byte{0}),
		"a gap between entries":  block(raftFlagEntries, []byte{2}, entry(1, 1, 0, ""), entry(3, 1, 0, "")),
		"a term going down":      block(raftFlagEntries, []byte{2}, entry(1, 2, 0, ""), entry(2, 1, 0, "")),
		"index 0":                block(raftFlagEntries, []byte{1}, entry(0, 1, 0, "")),
		"term 0":                 block(raftFlagEntries, []byte{1}, entry(1, 0, 0, "")),
		"an unknown entry type":  block(raftFlagEntries, []byte{1}, entry(1, 1, 3, "")),
		"data past the payload":  block(raftFlagEntries, []byte{1}, entry(1, 1, 0, "abc")[:6]),
		"a cut HardState":        block(raftFlagHardState, []byte{1, 1}),
		"replica 0":              {opRaftBlock, 1, 0, raftFlagHardState, 1, 1, 1},
		"truncation to 0":        {opRaftTruncate, 1, 1, 0},
		"a cut truncation":       {opRaftTruncate, 1, 1},
		"an empty state":         {opRaftState, 0},
		"a state past its log":   append([]byte{opRaftState, 1, 1, 1, 1, 0, 9}, uv(uv(uv(uv(nil, 1), 0), 5), 1)...),
		"a state with first 0":   append([]byte{opRaftState, 1, 1, 1, 1, 0, 0}, uv(uv(uv(uv(nil, 0), 0), 5), 1)...),
		"a cut state":            {opRaftState, 1, 1, 1, 1},
		"an unknown op":          {9, 1, 'k'},
		"entries count too high": block(raftFlagEntries, []byte{200}, entry(1, 1, 0, "")),
	} {
		if _, _, _, _, err := decodeAll(p); !errors.Is(err, errCorrupt) {
			t.Errorf("%s: %v, want errCorrupt", name, err)
		}
	}
	// Without a raft decoder (decodeChanges, as before raft), ops 4-6 are
	// unknown: corrupt.
	if err := decodeChanges(good, func(k, v []byte) error { return nil }, func(k []byte) error { return nil }); !errors.Is(err, errCorrupt) {
		t.Fatalf("decodeChanges of a raft block: %v, want errCorrupt", err)
	}
}

func FuzzRaftRecordDecode(f *testing.F) {
	b := raftBlock{key: raftKey{3, 1}, hs: hardState{2, 1, 1}, hasHS: true, ents: ents(1, 1, 2)}
	p := appendRaftBlock(nil, &b)
	p = appendRaftTruncate(p, raftTruncation{key: raftKey{3, 1}, first: 2, prevTerm: 1})
	p = appendRaftState(p, []replicaState{{key: raftKey{3, 1}, hs: hardState{2, 1, 1}, first: 2, prevTerm: 1, last: 2, lastTerm: 2}})
	f.Add(p)
	f.Add(appendWrite(appendRaftBlock(nil, &b), set("k", "v")))
	f.Add([]byte{opRaftBlock, 1, 1, raftFlagEntries, 1, 1, 1, 0, 5, 'a'})
	f.Fuzz(func(t *testing.T, p []byte) {
		_, blocks, _, states, err := decodeAll(p)
		if err != nil {
			if !errors.Is(err, errCorrupt) {
				t.Fatalf("an error that is not errCorrupt: %v", err)
			}
			return
		}
		for _, b := range blocks {
			if b.key.replica == 0 || (!b.hasHS && len(b.ents) == 0) {
				t.Fatalf("decoded a block that was never written: %+v", b)
			}
			for i, e := range b.ents {
				if e.index == 0 || e.term == 0 || e.typ > raftMaxEntryType ||
					(i > 0 && (e.index != b.ents[i-1].index+1 || e.term < b.ents[i-1].term)) {
					t.Fatalf("decoded an entry that was never written: %+v", e)
				}
				if e.dataOff+len(e.data) > len(p) || !bytes.Equal(p[e.dataOff:e.dataOff+len(e.data)], e.data) {
					t.Fatalf("entry data not where dataOff says")
				}
			}
			// A decoded block encodes and decodes to itself.
			_, again, _, _, err := decodeAll(appendRaftBlock(nil, &b))
			if err != nil || len(again) != 1 || again[0].hs != b.hs || len(again[0].ents) != len(b.ents) {
				t.Fatalf("re-encoding %+v: %v", b, err)
			}
		}
		for _, ss := range states {
			for _, s := range ss {
				if s.first == 0 || s.last+1 < s.first || s.hs.commit > s.last {
					t.Fatalf("decoded a state that is no log: %+v", s)
				}
			}
		}
	})
}
