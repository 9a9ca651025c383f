package actors

import (
	"context"
	"sync"
)

// Served says who answered a request: the node, the object's partition, and
// the partition's ownership epoch on that node. Tests check single ownership
// with it (a cluster's gateway can echo it in a test-only header).
type Served struct {
	Node      string
	Partition uint32
	Epoch     uint64
}

type servedKey struct{}

// servedSlot collects what served the requests made under one context.
type servedSlot struct {
	mu sync.Mutex
	s  Served
}

// WithServedRecord returns a context under which RecordServed notes who served
// a request, and a function that returns the last such note.
func WithServedRecord(ctx context.Context) (context.Context, func() Served) {
	slot := &servedSlot{}
	return context.WithValue(ctx, servedKey{}, slot), func() Served {
		slot.mu.Lock()
		defer slot.mu.Unlock()
		return slot.s
	}
}

// RecordServed notes s in ctx if it asked for it (WithServedRecord).
func RecordServed(ctx context.Context, s Served) {
	if slot, ok := ctx.Value(servedKey{}).(*servedSlot); ok {
		slot.mu.Lock()
		slot.s = s
		slot.mu.Unlock()
	}
}
