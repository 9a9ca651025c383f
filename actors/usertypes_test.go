package actors

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"sync"
	"testing"
)

// The counter type: a user-defined object with its own messages and storage.
type (
	inc       struct{ By int }
	get       struct{}
	incFail   struct{} // writes, then fails: nothing may be written
	incPanic  struct{} // writes, then panics: nothing may be written
	putMany   struct{ N int }
	listItems struct{ Prefix string }
)

func counterType() TypeSpec {
	read := func(c *Context) (int, error) {
		v, found, err := c.Get("n")
		if err != nil || !found {
			return 0, err
		}
		return strconv.Atoi(string(v))
	}
	return TypeSpec{Name: "counter", Handle: func(c *Context, msg any) (any, error) {
		switch m := msg.(type) {
		case inc:
			n, err := read(c)
			if err != nil {
				return nil, err
			}
			n += m.By
			return n, c.Put("n", []byte(strconv.Itoa(n)))
		case get:
			return read(c)
		case incFail:
			n, _ := read(c)
			_ = c.Put("n", []byte(strconv.Itoa(n+1000)))
			return nil, errors.New("refused by the handler")
		case incPanic:
			n, _ := read(c)
			_ = c.Put("n", []byte(strconv.Itoa(n+1000)))
			panic("handler bug")
		case putMany:
			for i := 0; i < m.N; i++ {
				if err := c.Put(fmt.Sprintf("item/%03d", i), []byte(strconv.Itoa(i))); err != nil {
					return nil, err
				}
			}
			if err := c.Delete("item/001"); err != nil {
				return nil, err
			}
			var keys []string // the turn sees its own writes
			err := c.List("item/", func(k string, _ []byte) bool { keys = append(keys, k); return true })
			return keys, err
		case listItems:
			var keys []string
			err := c.List(m.Prefix, func(k string, _ []byte) bool { keys = append(keys, k); return true })
			return keys, err
		}
		return nil, fmt.Errorf("unknown message %T", msg)
	}}
}

func TestUserType_CounterIsOneAtATimeAndDurable(t *testing.T) {
	dir := t.TempDir()
	n := startNode(t, dir, nodeOpts{types: []TypeSpec{counterType()}})
	ctx := context.Background()
	id := ObjectID{App: "app_t", Type: "counter", Key: "c1"}
	const callers, each = 32, 40
	var mu sync.Mutex
	var got []int
	var wg sync.WaitGroup
	for c := 0; c < callers; c++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < each; i++ {
				r, err := n.host.Request(ctx, id, inc{By: 1})
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				got = append(got, r.(int))
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	// One-at-a-time execution: the replies are exactly 1..N, each once.
	sort.Ints(got)
	for i, v := range got {
		if v != i+1 {
			t.Fatalf("reply %d is %d: increments interleaved", i, v)
		}
	}
	// A failing or panicking handler writes nothing and the object keeps working.
	if _, err := n.host.Request(ctx, id, incFail{}); err == nil || err.Error() != "refused by the handler" {
		t.Fatalf("incFail: %v", err)
	}
	if _, err := n.host.Request(ctx, id, incPanic{}); KindOf(err) != KindInternal {
		t.Fatalf("incPanic: %v, want an internal error", err)
	}
	if r, err := n.host.Request(ctx, id, get{}); err != nil || r.(int) != callers*each {
		t.Fatalf("after failures: %v %v", r, err)
	}
	n.stop()
	n = startNode(t, dir, nodeOpts{types: []TypeSpec{counterType()}})
	if r, err := n.host.Request(ctx, id, get{}); err != nil || r.(int) != callers*each {
		t.Fatalf("after restart: %v %v, want %d", r, err, callers*each)
	}
}

func TestUserType_StorageListMergesPendingWrites(t *testing.T) {
	n := startNode(t, t.TempDir(), nodeOpts{types: []TypeSpec{counterType()}})
	ctx := context.Background()
	id := ObjectID{App: "app_t", Type: "counter", Key: "l"}
	r, err := n.host.Request(ctx, id, putMany{N: 5})
	if err != nil {
		t.Fatal(err)
	}
	want := "[item/000 item/002 item/003 item/004]"
	if fmt.Sprint(r) != want {
		t.Fatalf("list in the writing turn: %v, want %s", r, want)
	}
	r, err = n.host.Request(ctx, id, listItems{Prefix: "item/"})
	if err != nil || fmt.Sprint(r) != want {
		t.Fatalf("list in a later turn: %v %v", r, err)
	}
	if r, _ := n.host.Request(ctx, id, listItems{Prefix: "nothing"}); len(r.([]string)) != 0 {
		t.Fatalf("list of an empty prefix: %v", r)
	}
}

func TestUserType_UnknownTypeAndRegistration(t *testing.T) {
	n := startNode(t, t.TempDir(), nodeOpts{})
	_, err := n.host.Request(context.Background(), ObjectID{App: "a", Type: "nobody", Key: "k"}, inc{})
	if !errors.Is(err, ErrNotFound) {
		t.Fatalf("message to a type without handler: %v", err)
	}
	h := NewHost(n.db, n.pipe, Config{})
	if err := h.RegisterType(TypeSpec{Name: "a:b", Handle: counterType().Handle}); err == nil {
		t.Fatal("type name with ':' registered")
	}
	if err := h.RegisterType(TypeSpec{Name: "x"}); err == nil {
		t.Fatal("type without handler registered")
	}
	if err := h.RegisterType(counterType()); err != nil {
		t.Fatal(err)
	}
	if err := h.RegisterType(counterType()); err == nil {
		t.Fatal("type registered twice")
	}
}

// TestUserType_OwnsALog: a user-defined type appends to its own log in its turn;
// the log is readable from outside like any object's.
func TestUserType_OwnsALog(t *testing.T) {
	typ := TypeSpec{Name: "orders", Handle: func(c *Context, msg any) (any, error) {
		offs, err := c.LogAppend(LogInput{Body: []byte(`{"event":"placed"}`)}, LogInput{Body: []byte(`{"event":"paid"}`)})
		if err != nil {
			return nil, err
		}
		if p, err := c.LogReadHot(offs[0], 0); err != nil || len(p.Records) != 2 {
			return nil, fmt.Errorf("read back: %v %v", p, err)
		}
		return offs, nil
	}}
	n := startNode(t, t.TempDir(), nodeOpts{types: []TypeSpec{typ}})
	ctx := context.Background()
	id := ObjectID{App: "app_t", Type: "orders", Key: "o1"}
	got, err := n.host.Request(ctx, id, "place")
	if err != nil || fmt.Sprint(got) != "[0 1]" {
		t.Fatalf("handler: %v %v", got, err)
	}
	page, err := NewLog(n.host, id).Read(ctx, 0, 0)
	if err != nil || len(page.Records) != 2 || string(page.Records[1].Body) != `{"event":"paid"}` {
		t.Fatalf("log read from outside: %+v %v", page, err)
	}
}
