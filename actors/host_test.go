package actors

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/holdfast/holdfast/persistence"
)

type testNode struct {
	t    *testing.T
	dir  string
	db   *persistence.DB
	pipe *persistence.Pipeline
	host *Host
}

func startNode(t *testing.T, dir string, cfg Config, types ...TypeSpec) *testNode {
	t.Helper()
	db, err := persistence.Open(persistence.Config{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	pipe := persistence.NewPipeline(db, persistence.PipelineConfig{})
	pipe.Start()
	h := NewHost(db, pipe, cfg)
	for _, ty := range types {
		if err := h.RegisterType(ty); err != nil {
			t.Fatal(err)
		}
	}
	h.Start()
	n := &testNode{t: t, dir: dir, db: db, pipe: pipe, host: h}
	t.Cleanup(n.stop)
	return n
}

func (n *testNode) stop() {
	if n.host == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := n.host.Close(ctx); err != nil {
		n.t.Errorf("host close: %v", err)
	}
	n.pipe.Close()
	if err := n.db.Close(); err != nil {
		n.t.Errorf("db close: %v", err)
	}
	n.host = nil
}

func (n *testNode) kv(typ, key string) *KV {
	return NewKV(n.host, ObjectID{App: "app_t", Type: typ, Key: key})
}

func TestKV_SetGetSurvivesRestart(t *testing.T) {
	dir := t.TempDir()
	n := startNode(t, dir, Config{})
	ctx := context.Background()
	o := n.kv("order", "o-1")
	r, err := o.Set(ctx, "status", "new")
	if err != nil || r.LogID != 1 {
		t.Fatalf("set: %+v %v", r, err)
	}
	if r, err = o.Increment(ctx, "n", 2); err != nil || string(r.Value) != "2" || r.LogID != 2 {
		t.Fatalf("increment: %+v %v", r, err)
	}
	n.stop()
	n = startNode(t, dir, Config{})
	st, err := n.kv("order", "o-1").Get(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.LogID != 2 || string(st.State["status"]) != `"new"` || string(st.State["n"]) != "2" {
		t.Fatalf("after restart: %+v", st)
	}
	b, _ := json.Marshal(st)
	t.Logf("%s", b)
}
