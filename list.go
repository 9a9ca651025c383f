package holdfast

import (
	"context"
	"iter"

	"github.com/holdfast/holdfast/actors"
)

type (
	// ListQuery asks for a page of the keys of one type's objects: Kind
	// ListObjects (any state), ListLogs or ListQueues; Prefix, After and
	// Limit (1 to 1,000) narrow it.
	ListQuery = actors.ListQuery
	// ListPage is a page of keys in byte order; Next, when not empty, is the
	// After of the next page.
	ListPage = actors.ListPage
	// ListKind says which objects of a type a listing shows.
	ListKind = actors.ListKind
)

// The listings.
const (
	ListObjects = actors.ListObjects
	ListLogs    = actors.ListLogs
	ListQueues  = actors.ListQueues
	// ListTypes lists an app's types (ListQuery.Type empty).
	ListTypes = actors.ListTypes
)

// List returns one page of the keys of q's objects, in byte order. It reads
// storage, not objects: nothing is activated.
func (r *Runtime) List(ctx context.Context, q ListQuery) (ListPage, error) {
	return r.node.List(ctx, q)
}

// Keys pages through every key of q (from q.After; q.Limit per page, 0
// meaning 1,000), yielding each in byte order; it stops at the first error,
// which it yields.
func (r *Runtime) Keys(ctx context.Context, q ListQuery) iter.Seq2[string, error] {
	if q.Limit == 0 {
		q.Limit = actors.MaxListLimit
	}
	return func(yield func(string, error) bool) {
		for {
			page, err := r.List(ctx, q)
			if err != nil {
				yield("", err)
				return
			}
			for _, k := range page.Keys {
				if !yield(k, nil) {
					return
				}
			}
			if page.Next == "" {
				return
			}
			q.After = page.Next
		}
	}
}
