package cluster

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/holdfast/holdfast/cold"
)

// shareNodes builds the check of each node id over its store, with a clock
// the test moves.
func shareNodes(t *testing.T, stores map[string]cold.Store, clock *time.Time) (map[string]*coldShare, map[string]NodeInfo) {
	t.Helper()
	checks := map[string]*coldShare{}
	live := map[string]NodeInfo{}
	for id, st := range stores {
		c := newColdShare(st, "prod/eu", id, "boot-"+id, coldShareGrace, testLogger(t))
		c.now = func() time.Time { return *clock }
		checks[id] = c
		live[id] = NodeInfo{ID: id, Boot: "boot-" + id, ColdMarker: true}
	}
	return checks, live
}

func round(checks map[string]*coldShare, live map[string]NodeInfo, ids ...string) {
	for _, id := range ids {
		checks[id].check(context.Background(), live)
	}
}

// TestColdShare_OneStoreForAll: nodes that share a store write cold objects
// once every node's marker was found; until a node's first round finds them
// all, it refuses (it does not know yet).
func TestColdShare_OneStoreForAll(t *testing.T) {
	clock := time.Unix(1000, 0)
	shared := cold.NewMemory()
	checks, live := shareNodes(t, map[string]cold.Store{"a": shared, "b": shared, "c": shared}, &clock)
	ctx := context.Background()
	if err := checks["a"].Create(ctx, "log/x/1", []byte("x")); !errors.Is(err, errColdNotChecked) {
		t.Fatalf("a create before any round: %v, want the not-checked refusal", err)
	}
	if pending := checks["a"].check(ctx, live); !pending {
		t.Fatal("a's first round, b's and c's markers not written yet: not pending")
	}
	if err := checks["a"].notShared(); !errors.Is(err, errColdNotChecked) {
		t.Fatalf("a after a round that found no other marker (within the grace): %v, want still not checked", err)
	}
	round(checks, live, "b", "c", "a")
	if err := checks["b"].notShared(); !errors.Is(err, errColdNotChecked) {
		t.Fatalf("b after a round before c wrote its marker: %v, want still not checked", err)
	}
	round(checks, live, "b")
	for id, c := range checks {
		if err := c.notShared(); err != nil {
			t.Fatalf("node %s after a round that found every marker: %v", id, err)
		}
	}
	if err := checks["b"].Create(ctx, "log/x/1", []byte("x")); err != nil {
		t.Fatalf("create through b: %v", err)
	}
	if _, err := shared.Stat(ctx, "log/x/1"); err != nil {
		t.Fatalf("the object b created: %v", err)
	}
	// Long after: still shared (the grace only matters to a missing marker).
	clock = clock.Add(time.Hour)
	round(checks, live, "a", "b", "c")
	if err := checks["c"].notShared(); err != nil {
		t.Fatalf("an hour later: %v", err)
	}
}

// TestColdShare_PrivateStoresAreRefused: nodes that believe they share a
// store but each write their own (cold.fs.shared on directories that are not
// one mount) refuse every cold write once the grace passed, naming the
// nodes whose markers they miss, and write again once the store is fixed.
func TestColdShare_PrivateStoresAreRefused(t *testing.T) {
	clock := time.Unix(1000, 0)
	shared := cold.NewMemory()
	private := cold.NewMemory()
	checks, live := shareNodes(t, map[string]cold.Store{"a": private, "b": shared, "c": shared}, &clock)
	ctx := context.Background()
	round(checks, live, "a", "b", "c")
	// Within the grace nothing is judged: b and c do not find a's marker yet.
	if err := checks["b"].notShared(); !errors.Is(err, errColdNotChecked) {
		t.Fatalf("b within the grace: %v", err)
	}
	clock = clock.Add(coldShareGrace)
	round(checks, live, "a", "b", "c")
	for id, c := range checks {
		err := c.Create(ctx, "log/y/1", []byte("y"))
		if !errors.Is(err, errColdNotShared) || errors.Is(err, errColdNotChecked) || !strings.Contains(err.Error(), "cold.fs.dir must be one directory every node mounts") {
			t.Fatalf("node %s create past the grace: %v, want the not-shared refusal", id, err)
		}
		want := "node a ("
		if id == "a" {
			want = "node b ("
		}
		if !strings.Contains(err.Error(), want) {
			t.Fatalf("node %s's refusal does not name the node it misses (%q): %v", id, want, err)
		}
	}
	for _, st := range []cold.Store{shared, private} {
		if infos, _ := st.List(ctx, "log/"); len(infos) != 0 {
			t.Fatalf("a refused create wrote %v", infos)
		}
	}
	// a is fixed and restarted (a new boot) on the shared store: it is
	// judged again from its new boot, and found.
	fixed := newColdShare(shared, "prod/eu", "a", "boot-a2", coldShareGrace, testLogger(t))
	fixed.now = func() time.Time { return clock }
	checks["a"] = fixed
	live["a"] = NodeInfo{ID: "a", Boot: "boot-a2", ColdMarker: true}
	round(checks, live, "a", "b", "c")
	for id, c := range checks {
		if err := c.Create(ctx, "log/y/"+id, []byte("y")); err != nil {
			t.Fatalf("node %s after a was fixed: %v", id, err)
		}
	}
}

// TestColdShare_RestartsAndClients: a node's new run removes its earlier
// runs' markers; client members and nodes that left are not looked for; a
// store that does not answer changes no verdict.
func TestColdShare_RestartsAndClients(t *testing.T) {
	clock := time.Unix(1000, 0)
	shared := cold.NewMemory()
	checks, live := shareNodes(t, map[string]cold.Store{"a": shared, "b": shared}, &clock)
	ctx := context.Background()
	round(checks, live, "a", "b", "a")
	again := newColdShare(shared, "prod/eu", "b", "boot-b2", coldShareGrace, testLogger(t))
	again.check(ctx, live)
	infos, err := shared.List(ctx, again.root+keyName("b")+"/")
	if err != nil || len(infos) != 1 || infos[0].Key != again.marker("b", "boot-b2") {
		t.Fatalf("b's markers after its restart: %v %v, want only the new run's", infos, err)
	}
	// A client member, or a node of an earlier version, writes no marker
	// and is not looked for; a node's own entry is skipped.
	live["cli"] = NodeInfo{ID: "cli", Boot: "boot-cli", Client: true}
	live["old"] = NodeInfo{ID: "old", Boot: "boot-old"}
	live["b"] = NodeInfo{ID: "b", Boot: "boot-b2", ColdMarker: true}
	clock = clock.Add(2 * coldShareGrace)
	if pending := checks["a"].check(ctx, live); pending {
		t.Fatal("a's round with b's marker and a client member: pending")
	}
	if err := checks["a"].notShared(); err != nil {
		t.Fatalf("a with a client member and an older node in the view: %v", err)
	}
	// A node that joins and never writes a marker (another store), then
	// leaves: refused while it is live, not after.
	live["d"] = NodeInfo{ID: "d", Boot: "boot-d", ColdMarker: true}
	checks["a"].check(ctx, live)
	clock = clock.Add(coldShareGrace)
	checks["a"].check(ctx, live)
	if err := checks["a"].notShared(); !errors.Is(err, errColdNotShared) {
		t.Fatalf("a with d's marker missing past the grace: %v", err)
	}
	// The store fails: the verdict stands.
	failing := &failingStore{Store: shared}
	checks["a"].Store = failing
	delete(live, "d")
	if pending := checks["a"].check(ctx, live); pending || !errors.Is(checks["a"].notShared(), errColdNotShared) {
		t.Fatalf("a round whose store fails: pending %v, verdict %v; want the usual interval and the verdict unchanged", pending, checks["a"].notShared())
	}
	checks["a"].Store = shared
	checks["a"].check(ctx, live)
	if err := checks["a"].notShared(); err != nil {
		t.Fatalf("after d left and the store answers: %v", err)
	}
}

// TestColdShare_KeysAreValid: markers are valid cold keys whatever the
// names (dots, slashes, long names).
func TestColdShare_KeysAreValid(t *testing.T) {
	long := strings.Repeat("n", 400)
	for _, name := range []string{"prod", ".", "..", "a/b", long, "é"} {
		c := newColdShare(cold.NewMemory(), name, name, "b00t", coldShareGrace, testLogger(t))
		for _, k := range []string{c.marker(name, "b00t"), c.marker(long, long)} {
			if err := cold.CheckKey(k); err != nil {
				t.Fatalf("name %q: marker %q: %v", name, k, err)
			}
		}
	}
	if keyName("a") == keyName("b") || keyName(long) == keyName(long+"x") {
		t.Fatal("distinct names make one key")
	}
}

// failingStore fails every Stat.
type failingStore struct{ cold.Store }

func (f *failingStore) Stat(context.Context, string) (cold.Info, error) {
	return cold.Info{}, errors.New("store down")
}

// TestColdShare_MarkerNotWritten: while the store refuses this node's
// marker, the node keeps refusing cold writes, retries at the usual interval
// (not the pending one), and once the marker is written checks as usual.
func TestColdShare_MarkerNotWritten(t *testing.T) {
	clock := time.Unix(1000, 0)
	shared := cold.NewMemory()
	checks, live := shareNodes(t, map[string]cold.Store{"a": shared, "b": shared}, &clock)
	ctx := context.Background()
	down := &createFails{Store: shared}
	checks["a"].Store = down
	for range 2 {
		if pending := checks["a"].check(ctx, live); pending {
			t.Fatal("a round whose marker write failed asks for the pending interval")
		}
		if err := checks["a"].notShared(); !errors.Is(err, errColdNotChecked) {
			t.Fatalf("a without its marker: %v", err)
		}
	}
	if infos, _ := shared.List(ctx, ""); len(infos) != 0 {
		t.Fatalf("written while the store refused: %v", infos)
	}
	checks["a"].Store = shared
	round(checks, live, "b", "a", "b")
	for id, c := range checks {
		if err := c.notShared(); err != nil {
			t.Fatalf("node %s once a's marker is written: %v", id, err)
		}
	}
}

// createFails fails every Create.
type createFails struct{ cold.Store }

func (f *createFails) Create(context.Context, string, []byte) error {
	return errors.New("store down")
}
