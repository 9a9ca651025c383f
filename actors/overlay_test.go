package actors

import (
	"context"
	"fmt"
	"testing"

	"github.com/holdfast/holdfast/internal/pipehook"
	"github.com/holdfast/holdfast/persistence"
)

// heldTicket returns the ticket of a write that the held pipeline has not applied.
func TestStore_ScanMergesOverlayOverBadger(t *testing.T) {
	hd := newHold(t)
	hd.open() // the first writes go through
	n := startNode(t, t.TempDir(), nodeOpts{pipe: persistence.PipelineConfig{Hooks: &pipehook.Hooks{BeforeCommit: hd.before}}})
	ctx := context.Background()
	base := &persistence.Write{Sets: []persistence.KV{
		{Key: []byte("p/a"), Value: []byte("A")}, {Key: []byte("p/c"), Value: []byte("C")},
		{Key: []byte("p/e"), Value: []byte("E")}, {Key: []byte("q/x"), Value: []byte("X")},
	}}
	tk := n.pipe.Submit(base)
	if err := tk.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the base write to be applied", tk.Applied)
	hd.mu.Lock()
	hd.held, hd.release = true, make(chan struct{})
	hd.mu.Unlock()
	var ov overlay
	pending := &persistence.Write{
		Sets:    []persistence.KV{{Key: []byte("p/b"), Value: []byte("B")}, {Key: []byte("p/e"), Value: []byte("E2")}, {Key: []byte("p/f"), Value: []byte("F")}},
		Deletes: [][]byte{[]byte("p/c")},
	}
	ov.record(pending, n.pipe.Submit(pending), nil)
	st := store{db: n.db, ov: &ov}
	scan := func(start, end string, limit int) string {
		var got []string
		var s, e []byte
		if start != "" {
			s = []byte(start)
		}
		if end != "" {
			e = []byte(end)
		}
		err := st.scan(ctx, []byte("p/"), s, e, func(k, v []byte) (bool, error) {
			got = append(got, string(k)+"="+string(v))
			return len(got) < limit, nil
		})
		if err != nil {
			t.Fatal(err)
		}
		return fmt.Sprint(got)
	}
	for _, c := range []struct {
		start, end string
		limit      int
		want       string
	}{
		{"", "", 100, "[p/a=A p/b=B p/e=E2 p/f=F]"},
		{"p/b", "p/f", 100, "[p/b=B p/e=E2]"},
		{"", "", 2, "[p/a=A p/b=B]"},
		{"p/c", "", 1, "[p/e=E2]"},
	} {
		if got := scan(c.start, c.end, c.limit); got != c.want {
			t.Errorf("scan [%q, %q) limit %d = %s, want %s", c.start, c.end, c.limit, got, c.want)
		}
	}
	if v, found, _ := st.get(ctx, []byte("p/c")); found {
		t.Errorf("deleted key read as %q", v)
	}
	if v, found, _ := st.get(ctx, []byte("p/e")); !found || string(v) != "E2" {
		t.Errorf("p/e = %q, want the pending E2", v)
	}
	hd.open()
}

// TestOverlay_EvictDropsWritesOnceBadgerShowsThem: an overlay keeps the entries
// of writes the applier holds back, and drops them at the first evict after
// Badger shows them; an evict before that drops nothing.
func TestOverlay_EvictDropsWritesOnceBadgerShowsThem(t *testing.T) {
	applyHold := newHold(t)
	n := startNode(t, t.TempDir(), nodeOpts{pipe: persistence.PipelineConfig{Hooks: &pipehook.Hooks{BeforeApply: func(uint64) { applyHold.before(1) }}}})
	ctx := context.Background()
	var ov overlay
	var tickets []*persistence.Ticket
	for i := range 3 {
		w := &persistence.Write{Sets: []persistence.KV{{Key: fmt.Appendf(nil, "k%d", i), Value: []byte("v")}}}
		tk := n.pipe.Submit(w)
		ov.record(w, tk, nil)
		tickets = append(tickets, tk)
	}
	for _, tk := range tickets {
		if err := tk.Wait(ctx); err != nil { // durable; the applier is held
			t.Fatal(err)
		}
	}
	ov.evict(n.pipe.AppliedSeq())
	if len(ov.entries) != 3 {
		t.Fatalf("%d overlay entries while Badger shows none of the writes, want 3", len(ov.entries))
	}
	applyHold.open()
	waitFor(t, "the writes to be applied", tickets[2].Applied)
	waitFor(t, "the applied sequence number to pass the writes", func() bool {
		return n.pipe.AppliedSeq() >= n.pipe.Committed()
	})
	ov.evict(n.pipe.AppliedSeq())
	if len(ov.entries) != 0 {
		t.Fatalf("%d overlay entries after Badger shows every write, want 0", len(ov.entries))
	}
}
