// Command counter is a user-defined object type on an embedded Holdfast runtime: a
// counter with its own messages, run one message at a time in each counter's actor,
// its state kept in the object's own durable storage.
//
//	go run ./examples/counter -data ./counter-data
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log"
	"sync"

	"github.com/holdfast/holdfast"
)

// Messages of the counter type.
type (
	// Add adds By to the counter and replies with the new value.
	Add struct{ By int64 }
	// Value replies with the current value.
	Value struct{}
	// Reset sets the counter to zero, only if it is at Expect (a compare-and-set).
	Reset struct{ Expect int64 }
)

// ErrConflict is Reset's reply when the counter moved.
var ErrConflict = errors.New("counter: value changed")

// Counter is the object type. Its handler runs in each counter's actor,
// one message at a time; what it saves commits with the turn, durably,
// before the reply leaves (docs/comparison.md sets it beside a Restate
// virtual object and a Dapr actor).
var Counter = holdfast.TypeSpec{
	Name: "counter",
	Handle: func(c *holdfast.Context, msg any) (any, error) {
		cur, err := holdfast.Load[int64](c, "value") // 0 before the first Add
		if err != nil {
			return nil, err
		}
		switch m := msg.(type) {
		case Add:
			return cur + m.By, holdfast.Save(c, "value", cur+m.By)
		case Value:
			return cur, nil
		case Reset:
			if cur != m.Expect {
				return nil, ErrConflict
			}
			return int64(0), holdfast.Save(c, "value", 0)
		}
		return nil, fmt.Errorf("counter: unknown message %T", msg)
	},
}

// run adds 1 from `callers` goroutines, `each` times, and returns the final value.
func run(ctx context.Context, rt *holdfast.Runtime, key string, callers, each int) (int64, error) {
	var wg sync.WaitGroup
	errs := make(chan error, callers)
	for i := 0; i < callers; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := 0; j < each; j++ {
				if _, err := rt.Request(ctx, "app_example", "counter", key, Add{By: 1}); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		return 0, err
	}
	return holdfast.Call[int64](ctx, rt, "app_example", "counter", key, Value{}) // the reply as an int64: no assertion
}

func main() {
	dir := flag.String("data", "./counter-data", "data directory")
	flag.Parse()
	ctx := context.Background()
	rt, err := holdfast.Open(holdfast.Options{DataDir: *dir, Types: []holdfast.TypeSpec{Counter}})
	if err != nil {
		log.Fatal(err)
	}
	defer rt.Close(ctx)
	v, err := run(ctx, rt, "visits", 8, 100)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("counter visits = %d (it keeps counting across runs)\n", v)
}
