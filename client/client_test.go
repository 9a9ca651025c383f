package client_test

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/holdfast/holdfast/actors"
	"github.com/holdfast/holdfast/client"
	"github.com/holdfast/holdfast/cluster"
	"github.com/holdfast/holdfast/gateway"
)

var app = gateway.App{ID: "app_client", Key: "pk_client", Secret: "sk_client_secret_0123"}

// start runs a real node and its gateway on 127.0.0.1 and returns a client of
// it, and its URL.
func start(t *testing.T) (*client.Client, string) {
	t.Helper()
	node, err := cluster.Start(cluster.Config{DataDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	gw := gateway.New(gateway.Config{Node: node, Apps: gateway.NewApps([]gateway.App{app})})
	// Served as holdfast serve serves it: through the gateway's Front.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	front := gateway.NewFront(gw, &http.Server{ReadHeaderTimeout: 10 * time.Second})
	served := make(chan error, 1)
	go func() { served <- front.Serve(ln) }()
	url := "http://" + ln.Addr().String()
	t.Cleanup(func() {
		_ = front.Close()
		<-served
		gw.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := node.Close(ctx); err != nil {
			t.Errorf("close the node: %v", err)
		}
	})
	c, err := client.New(url, app.Key, app.Secret)
	if err != nil {
		t.Fatal(err)
	}
	return c, url
}

// must returns v, or fails the test (a panic, with err) when err is not nil.
func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

func TestClient_New(t *testing.T) {
	for _, c := range []struct{ url, key, secret string }{
		{"ftp://x", "k", "s"}, {"http://", "k", "s"}, {"http://127.0.0.1:1", "", "s"}, {"http://127.0.0.1:1", "k", ""},
	} {
		if _, err := client.New(c.url, c.key, c.secret); err == nil {
			t.Errorf("New(%q, %q, %q) accepted", c.url, c.key, c.secret)
		}
	}
}

func TestClient_Objects(t *testing.T) {
	c, url := start(t)
	ctx := context.Background()
	o := c.Object("order", "o 1?x#y%") // a key that needs escaping
	if r := must(o.Set(ctx, "status", "new")); r.LogID != 1 {
		t.Fatalf("set: %+v", r)
	}
	r := must(o.Increment(ctx, "n", 5, client.IdempotencyKey("k1")))
	again := must(o.Increment(ctx, "n", 5, client.IdempotencyKey("k1")))
	if r.LogID != 2 || string(r.Value) != "5" || again.LogID != 2 || string(again.Value) != "5" {
		t.Fatalf("increment %+v, its retry %+v: want log_id 2 and 5 both times", r, again)
	}
	must(o.Append(ctx, "tags", "a"))
	must(o.Patch(ctx, map[string]any{"status": "packed", "tags": nil}))
	must(o.Transaction(ctx, []client.Op{{Op: "increment", Key: "n", By: json.RawMessage(`2`)}, {Op: "set", Key: "x", Value: json.RawMessage(`[1]`)}}))
	st := must(o.Get(ctx))
	if st.LogID != 5 || string(st.State["n"]) != "7" || string(st.State["status"]) != `"packed"` || st.State["tags"] != nil || string(st.State["x"]) != "[1]" {
		t.Fatalf("state %+v", st)
	}
	if v := must(o.GetSlot(ctx, "n")); string(v) != "7" {
		t.Fatalf("slot n = %s", v)
	}
	changes := must(o.Changes(ctx, 3, 0))
	if len(changes) != 4 || changes[0].LogID != 4 {
		t.Fatalf("changes after 3: %+v", changes)
	}
	must(o.Delete(ctx, "x"))
	if _, err := o.GetSlot(ctx, "x"); !client.IsNotFound(err) {
		t.Fatalf("a deleted slot: %v", err)
	}
	// An error carries the server's status, code, message and request id.
	_, err := o.Increment(ctx, "status", 1)
	var e *client.Error
	if !errors.As(err, &e) || e.Status != http.StatusUnprocessableEntity || e.Code != "invalid" || e.Message == "" || e.RequestID == "" {
		t.Fatalf("increment of a string: %#v", err)
	}
	if err := o.Purge(ctx); err != nil {
		t.Fatal(err)
	}
	if st := must(o.Get(ctx)); len(st.State) != 0 {
		t.Fatalf("after a purge: %+v", st)
	}
	// A bad secret: 401.
	bad := must(client.New(url, app.Key, "sk_wrong_secret_0123"))
	if _, err := bad.Object("order", "o 1?x#y%").Get(ctx); !errors.As(err, &e) || e.Status != http.StatusUnauthorized {
		t.Fatalf("a bad secret: %v", err)
	}
}

func TestClient_Batch(t *testing.T) {
	c, _ := start(t)
	ctx := context.Background()
	res := must(c.Batch(ctx,
		client.IncrementOp("c/a", "n", 2).WithIdempotencyKey("i1"),
		client.SetOp("c/b", "s", map[string]int{"x": 1}),
		client.IncrementOp("c/b", "s", 1), // not a number: this one fails alone
		client.AppendOp("c/a", "l", "v"),
		client.TransactionOp("c/a", []client.Op{{Op: "delete", Key: "l"}}),
		client.LogAppendOp("ev/1", client.Record{Body: json.RawMessage(`{"k": 1}`), DeduplicationKey: "d1"}),
		client.EnqueueOp("jobs/q", client.Message{ID: "m1", Payload: "hi"}),
		client.GetOp("c/a", ""),
		client.DeleteOp("c/a", "n"),
		client.GetOp("c/a", "n"),
	))
	if len(res) != 10 {
		t.Fatalf("%d results", len(res))
	}
	var w client.WriteResult
	if err := res[0].Decode(&w); err != nil || w.LogID != 1 || string(w.Value) != "2" {
		t.Fatalf("increment: %+v %v", w, err)
	}
	var e *client.Error
	if !errors.As(res[2].Err, &e) || e.Status != http.StatusUnprocessableEntity || e.Code != "invalid" || res[2].Decode(&w) != res[2].Err {
		t.Fatalf("the failed increment: %+v", res[2])
	}
	if res[5].Status != 200 || string(res[5].Body) != `{"offsets":[0]}` || string(res[6].Body) != `{"ids":["m1"]}` {
		t.Fatalf("log append %s, enqueue %s", res[5].Body, res[6].Body)
	}
	var st client.State
	if err := res[7].Decode(&st); err != nil || st.LogID != 3 || string(st.State["n"]) != "2" || st.State["l"] != nil {
		t.Fatalf("get: %+v %v", st, err)
	}
	if !client.IsNotFound(res[9].Err) {
		t.Fatalf("get of the deleted slot: %+v", res[9])
	}
	// The idempotency key is the route's: the same increment by its route replays.
	again := must(c.Object("c", "a").Increment(ctx, "n", 2, client.IdempotencyKey("i1")))
	if again.LogID != 1 || string(again.Value) != "2" {
		t.Fatalf("the batch's increment retried by its route: %+v", again)
	}
	// Too many operations are refused before anything is sent; an op whose
	// fields clash with the batch's own is refused too.
	if _, err := c.Batch(ctx, make([]client.BatchOp, client.MaxBatchOps+1)...); err == nil {
		t.Fatal("1,001 operations accepted")
	}
	clash := client.BatchOp{Object: "c/a", Op: "set", Slot: "s", Fields: map[string]json.RawMessage{"slot": json.RawMessage(`"t"`)}}
	if _, err := c.Batch(ctx, clash); err == nil {
		t.Fatal("a field set twice accepted")
	}
	// A malformed batch is the batch's error: an unknown op.
	if _, err := c.Batch(ctx, client.BatchOp{Object: "c/a", Op: "purge"}); !errors.As(err, &e) || e.Status != http.StatusBadRequest {
		t.Fatalf("an unknown op: %v", err)
	}
}

func TestClient_LogAndQueue(t *testing.T) {
	c, _ := start(t)
	ctx := context.Background()
	l := c.Log("ev", "1")
	offs := must(l.Append(ctx, client.Record{Body: map[string]int{"i": 0}, DeduplicationKey: "a"}, client.Record{Body: json.RawMessage(`{"i": 1}`)}))
	if len(offs) != 2 || offs[0] != 0 || offs[1] != 1 {
		t.Fatalf("offsets %v", offs)
	}
	if again := must(l.Append(ctx, client.Record{Body: 9, DeduplicationKey: "a"})); len(again) != 1 || again[0] != 0 {
		t.Fatalf("a seen deduplication key: %v", again)
	}
	p := must(l.Read(ctx, 1, 10))
	if len(p.Records) != 1 || string(p.Records[0].Body) != `{"i":1}` || p.NextOffset != 2 { // compacted by encoding/json
		t.Fatalf("read from 1: %+v", p)
	}
	q := c.Queue("jobs", "q")
	ids := must(q.Enqueue(ctx, client.Message{ID: "m1", Payload: "a"}, client.Message{Payload: map[string]int{"b": 2}}))
	if len(ids) != 2 || ids[0] != "m1" || ids[1] == "" {
		t.Fatalf("ids %v", ids)
	}
	got := must(q.Receive(ctx, 10, 0))
	if len(got) != 2 || got[0].ID != "m1" || string(got[0].Payload) != `"a"` || got[0].Receipt == "" || got[0].Attempt != 1 {
		t.Fatalf("received %+v", got)
	}
	if n := must(q.Ack(ctx, got[0].Receipt)); n != 1 {
		t.Fatalf("acked %d", n)
	}
	// A receipt no longer held: the others are acked, and the count comes with the error.
	var e *client.Error
	if n, err := q.Ack(ctx, got[1].Receipt, got[0].Receipt); n != 1 || !errors.As(err, &e) || e.Code != "lease_not_held" {
		t.Fatalf("ack with a settled receipt: %d, %v", n, err)
	}
	if more := must(q.Receive(ctx, 10, 0)); len(more) != 0 {
		t.Fatalf("after the acks: %+v", more)
	}
	// A delivery its handler calls hopeless is a dead letter, listed with
	// when it failed.
	must(q.Enqueue(ctx, client.Message{ID: "m3", Topic: "t", Payload: 3}))
	d := must(q.Receive(ctx, 1, 0))
	if _, err := c.Do(ctx, http.MethodPost, "/api/v1/queues/"+app.ID+"/jobs/q/dead", nil, nil, map[string]string{"receipt": d[0].Receipt, "reason": "bad input"}, nil); err != nil {
		t.Fatal(err)
	}
	dead := must(q.DeadLetters(ctx, client.DeadLetterQuery{Topic: "t"}))
	if len(dead) != 1 || dead[0].ID != "m3" || dead[0].Topic != "t" || string(dead[0].Payload) != "3" || dead[0].Attempts != 1 || dead[0].FailedAt == 0 || dead[0].Target == "" {
		t.Fatalf("dead letters: %+v", dead)
	}
	if none := must(q.DeadLetters(ctx, client.DeadLetterQuery{Topic: "other"})); len(none) != 0 {
		t.Fatalf("dead letters of another topic: %+v", none)
	}
}

// The client's copies of the server's replies carry every field of them.
func TestClient_RepliesCarryEveryField(t *testing.T) {
	for _, pair := range [][2]any{{actors.QueueDeadLetter{}, client.DeadLetter{}}} {
		have := map[string]bool{}
		ct := reflect.TypeOf(pair[1])
		for i := range ct.NumField() {
			have[strings.Split(ct.Field(i).Tag.Get("json"), ",")[0]] = true
		}
		st := reflect.TypeOf(pair[0])
		for i := range st.NumField() {
			if name := strings.Split(st.Field(i).Tag.Get("json"), ",")[0]; name != "-" && !have[name] {
				t.Errorf("%s has no field %q of %s", ct, name, st)
			}
		}
	}
}

// next returns the feed's next event that is not a run:* event, or fails.
func next(t *testing.T, f *client.Feed) client.Event {
	t.Helper()
	select {
	case ev, ok := <-f.C:
		if !ok {
			t.Fatalf("the feed ended: %v", f.Err())
		}
		return ev
	case <-time.After(10 * time.Second):
		t.Fatal("no event in 10s")
	}
	return client.Event{}
}

func TestClient_Watch(t *testing.T) {
	c, url := start(t)
	ctx := context.Background()
	o := c.Object("order", "w1")
	must(o.Set(ctx, "a", 1))
	f := o.Watch(ctx)
	defer f.Close()
	if ev := next(t, f); ev.Kind != "snapshot" || ev.LogID != 1 || string(ev.State["a"]) != "1" {
		t.Fatalf("first event %+v", ev)
	}
	must(o.Set(ctx, "a", 2))
	must(o.Patch(ctx, map[string]any{"b": true, "a": nil}))
	if ev := next(t, f); ev.Kind != "change" || ev.LogID != 2 || len(ev.Changes) != 1 || ev.Changes[0].Key != "a" || string(ev.Changes[0].Value) != "2" {
		t.Fatalf("the set: %+v", ev)
	}
	if ev := next(t, f); ev.Kind != "batch" || ev.LogID != 3 || len(ev.Changes) != 2 {
		t.Fatalf("the patch: %+v", ev)
	}
	f.Close()
	if _, ok := <-f.C; ok {
		t.Fatal("C is open after Close")
	}
	if err := f.Err(); err != nil {
		t.Fatalf("Err after Close: %v", err)
	}
	// A join refused (a bad secret) ends the feed with the reason.
	bad := must(client.New(url, app.Key, "sk_wrong_secret_0123"))
	bf := bad.Object("order", "w1").Watch(ctx)
	for range bf.C {
	}
	if err := bf.Err(); err == nil || !strings.Contains(err.Error(), "refused") {
		t.Fatalf("a refused join: %v", err)
	}
}

// TestClient_List: List pages (limit, next) and Keys walks every page, in
// byte order, for objects, logs and queues; a refused query is an *Error.
func TestClient_List(t *testing.T) {
	c, _ := start(t)
	ctx := context.Background()
	var want []string
	for _, k := range []string{"b", "a", "c10", "c9", "d"} {
		must(c.Object("order", k).Set(ctx, "n", 1))
		want = append(want, k)
	}
	must(c.Log("order", "log-1").Append(ctx, client.Record{Body: 1}))
	must(c.Queue("order", "q-1").Enqueue(ctx, client.Message{ID: "m", Payload: 1}))
	want = append(want, "log-1", "q-1")
	slices.Sort(want)
	page := must(c.List(ctx, client.ListObjects, "order", client.ListOptions{Limit: 2}))
	if !slices.Equal(page.Keys, want[:2]) || page.Next != want[1] {
		t.Fatalf("first page %+v, want keys %q and next %q", page, want[:2], want[1])
	}
	var all []string
	for k, err := range c.Keys(ctx, client.ListObjects, "order", client.ListOptions{Limit: 3}) {
		if err != nil {
			t.Fatal(err)
		}
		all = append(all, k)
	}
	if !slices.Equal(all, want) {
		t.Fatalf("Keys: %q, want %q", all, want)
	}
	if p := must(c.List(ctx, client.ListObjects, "order", client.ListOptions{Prefix: "c"})); !slices.Equal(p.Keys, []string{"c10", "c9"}) || p.Next != "" {
		t.Fatalf("prefix c: %+v", p)
	}
	if p := must(c.List(ctx, client.ListLogs, "order", client.ListOptions{})); !slices.Equal(p.Keys, []string{"log-1"}) {
		t.Fatalf("logs: %+v", p)
	}
	if p := must(c.List(ctx, client.ListQueues, "order", client.ListOptions{})); !slices.Equal(p.Keys, []string{"q-1"}) {
		t.Fatalf("queues: %+v", p)
	}
	if p := must(c.Types(ctx, client.ListOptions{})); !slices.Equal(p.Types, []string{"order"}) || p.Next != "" {
		t.Fatalf("types: %+v", p)
	}
	var ce *client.Error
	if _, err := c.List(ctx, client.ListObjects, "a:b", client.ListOptions{}); !errors.As(err, &ce) || ce.Status != 400 {
		t.Fatalf("a type with ':': %v, want a 400 *Error", err)
	}
}
