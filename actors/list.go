package actors

import (
	"context"
	"errors"
	"slices"
	"sync"
	"time"

	"github.com/holdfast/holdfast/persistence"
	"github.com/holdfast/holdfast/replication"
)

// Listing the keys of a type's objects (spec/batch.md, "the keys of a
// type"): the node's storage is read directly, without activating the
// objects; the cluster merges the pages of its nodes (cluster/list.go).

// ListKind says which objects of a type a listing shows.
type ListKind string

const (
	// ListObjects: the objects that hold any state: KV slots, a user-defined
	// type's storage, a log, a queue, or alarms.
	ListObjects ListKind = "objects"
	// ListLogs: the objects that hold a log. A log keeps its offsets when
	// trimmed to nothing, so it stays listed (as a NATS stream with no
	// messages does).
	ListLogs ListKind = "logs"
	// ListQueues: the objects that hold a queue.
	ListQueues ListKind = "queues"
	// ListTypes: the app's types that have objects holding any stored data
	// (Type is empty; the page's keys are type names).
	ListTypes ListKind = "types"
)

// Listing limits (spec/batch.md).
const (
	DefaultListLimit = 100
	MaxListLimit     = 1000
)

// ListQuery asks for a page of the keys of one type's objects.
type ListQuery struct {
	App, Type string
	Kind      ListKind
	// Prefix and After: keys that start with Prefix and sort after After
	// (byte order).
	Prefix, After string
	// Limit is the page size, 1 to MaxListLimit.
	Limit int
}

// ListPage is a page of keys in byte order; Next, when set, is the After of
// the next page ("" on the last page).
type ListPage struct {
	Keys []string `json:"keys"`
	Next string   `json:"next,omitempty"`
}

// Check validates q (400 for a bad name, kind or limit).
func (q ListQuery) Check() error {
	if err := q.checkNames(); err != nil {
		return err
	}
	if q.Limit < 1 || q.Limit > MaxListLimit {
		return badRequestf("limit must be 1 to %d", MaxListLimit)
	}
	return nil
}

// checkNames is Check but for the limit's upper bound (ListKeys is asked
// for one key more than a page, to see whether another follows).
func (q ListQuery) checkNames() error {
	if q.App == "" || len(q.App) > MaxNameBytes {
		return badRequestf("app must be 1 to %d bytes", MaxNameBytes)
	}
	if q.Kind == ListTypes {
		if q.Type != "" {
			return badRequestf("a listing of types names no type")
		}
	} else if err := checkName("type", q.Type, ":/"); err != nil {
		return err
	}
	if _, ok := listMarks[q.Kind]; !ok {
		return badRequestf("unknown listing %q", q.Kind)
	}
	if len(q.Prefix) > MaxNameBytes || len(q.After) > MaxNameBytes {
		return badRequestf("prefix and after are at most %d bytes", MaxNameBytes)
	}
	return nil
}

// listMarks are, per kind, the keys (behaviour byte and sub-byte, keys.go)
// whose presence lists an object. A KV object's change log and idempotency
// records are not state a listing shows: a purged object, which keeps one
// change-log entry, is not listed. An alarm's generation counter outlives
// its alarms: only alarm records count.
var listMarks = map[ListKind][][]byte{
	ListObjects: {{behaviourKV, kvSlot}, {behaviourUser}, {behaviourLog}, {behaviourQueue}, {behaviourAlarm, alarmRecord}},
	ListLogs:    {{behaviourLog}},
	ListQueues:  {{behaviourQueue}},
	ListTypes:   nil, // any key: types are listed for completion and browsing
}

// PageOf makes the page of a listing from keys in byte order, gathered with
// a limit of q.Limit+1 so that a next page shows.
func PageOf(keys []string, limit int) ListPage {
	if len(keys) > limit {
		return ListPage{Keys: keys[:limit], Next: keys[limit-1]}
	}
	if keys == nil {
		keys = []string{}
	}
	return ListPage{Keys: keys}
}

// ListKeys returns the first q.Limit keys of q's objects in the partitions
// parts that this node serves, in byte order, and the partitions of parts
// it does not serve (for the caller to list elsewhere). It first waits, per
// partition, until Badger shows every write acknowledged before the call
// (Pipeline.WaitPartition, in parallel: a raft round each in a replicated
// cluster), so that a listing misses no object whose write was acknowledged
// before it began. It is not a snapshot: an object written or deleted while
// it runs may or may not show.
func (h *Host) ListKeys(ctx context.Context, q ListQuery, parts []uint32) (keys []string, notServed []uint32, err error) {
	if err := q.checkNames(); err != nil {
		return nil, nil, err
	}
	if q.Limit < 1 {
		return nil, nil, badRequestf("limit must be at least 1")
	}
	if err := h.pipe.Failed(); err != nil {
		return nil, nil, unavailable("the node's storage failed; it must restart", err)
	}
	var (
		mu     sync.Mutex
		served []uint32
		first  error
		wg     sync.WaitGroup
	)
	for _, p := range parts {
		if int(p) >= h.db.Partitions() {
			return nil, nil, badRequestf("partition %d does not exist", p)
		}
		if h.epoch(p) == 0 {
			notServed = append(notServed, p)
			continue
		}
		wg.Go(func() {
			err := h.pipe.WaitPartition(ctx, p)
			mu.Lock()
			defer mu.Unlock()
			var nl *replication.NotLeaderError
			switch {
			case err == nil:
				served = append(served, p)
			case errors.As(err, &nl) || errors.Is(err, replication.ErrUnknownGroup):
				notServed = append(notServed, p)
			case first == nil:
				first = err
			}
		})
	}
	wg.Wait()
	if first != nil {
		if ctx.Err() != nil {
			return nil, nil, &Error{Kind: KindUnavailable, Msg: "the listing timed out", RetryAfter: time.Second}
		}
		return nil, nil, unavailable("the listing could not read the node's storage", first)
	}
	slices.Sort(served)
	slices.Sort(notServed)
	pq := persistence.ListQuery{App: q.App, Type: q.Type, Marks: listMarks[q.Kind], Prefix: q.Prefix, After: q.After, Limit: q.Limit}
	if q.Kind == ListTypes {
		keys, err = h.db.ListTypes(ctx, served, pq)
	} else {
		keys, err = h.db.ListObjects(ctx, served, pq)
	}
	if err != nil {
		return nil, nil, unavailable("the listing could not read the node's storage", err)
	}
	return keys, notServed, nil
}
