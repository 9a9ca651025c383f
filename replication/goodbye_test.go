package replication

import (
	"slices"
	"testing"
)

// TestGoodbyePrevs: a goodbye is sent from every index between the removed
// replica's Match and the entry that removed it (raft ignores a MsgApp below
// the receiver's commit and refuses one past its log, and the leader knows
// neither), bounded to the last maxGoodbyePrevs and Match for a long gap.
func TestGoodbyePrevs(t *testing.T) {
	for _, c := range []struct {
		match, index uint64
		want         []uint64
	}{
		{2, 5, []uint64{2, 3, 4, 5}},
		{5, 5, []uint64{5}},
		{7, 5, []uint64{5}}, // Match past the entry: from the entry
		{0, 2, []uint64{0, 1, 2}},
		{10, 100, append([]uint64{10}, seq(85, 100)...)},
	} {
		got := goodbyePrevs(goodbye{match: c.match, index: c.index})
		if !slices.Equal(got, c.want) {
			t.Errorf("match %d index %d: %v, want %v", c.match, c.index, got, c.want)
		}
	}
}

func seq(from, to uint64) []uint64 {
	var out []uint64
	for i := from; i <= to; i++ {
		out = append(out, i)
	}
	return out
}
