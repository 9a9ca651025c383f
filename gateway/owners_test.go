package gateway

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/holdfast/holdfast/actors"
	"github.com/holdfast/holdfast/cluster"
)

// holdUnsubscribe is a node whose unsubscribes block until their context ends.
type holdUnsubscribe struct {
	Node
	entered  chan struct{}
	returned atomic.Bool
	cause    atomic.Value // error
}

func (n *holdUnsubscribe) Request(ctx context.Context, id actors.ObjectID, msg any) (any, error) {
	if _, ok := msg.(actors.KVUnsubscribe); !ok {
		return n.Node.Request(ctx, id, msg)
	}
	n.entered <- struct{}{}
	<-ctx.Done()
	n.cause.Store(ctx.Err())
	time.Sleep(20 * time.Millisecond) // a Close that does not wait returns first
	n.returned.Store(true)
	return nil, ctx.Err()
}

// Server.Close ends what the websockets left running (here the unsubscribe of
// a durable channel the closed socket had joined) and waits for it: the node
// closes after Server.Close.
func TestServer_CloseWaitsForSocketGoroutines(t *testing.T) {
	hold := &holdUnsubscribe{entered: make(chan struct{}, 4)}
	ts := newTestServerWith(t, cluster.Config{}, func(c *Config) {
		hold.Node = c.Node
		c.Node = hold
	})
	c := ts.dial(t)
	c.joinOK(topicOf("order", "o1"), secretParams())
	ts.gw.Close()
	if !hold.returned.Load() {
		t.Fatal("Server.Close returned before the unsubscribe of the closed socket's channel did")
	}
	if err, _ := hold.cause.Load().(error); !errors.Is(err, context.Canceled) {
		t.Fatalf("the unsubscribe's context ended with %v, want context.Canceled", err)
	}
}
