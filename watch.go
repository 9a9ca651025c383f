package holdfast

import (
	"context"
	"encoding/json"
	"sync"

	"github.com/holdfast/holdfast/actors"
)

// FeedEvent is one event of an object's live feed (Runtime.Watch): Name is
// "snapshot" ({"state","log_id"}), "change" ({"key","value","previous","log_id"};
// after a rejoin, the replayed ones have no "previous"), "batch"
// ({"changes","log_id"}), "log_truncated" ({"after_log_id","oldest_log_id"}:
// changes were lost to the change log's retention while the feed was away;
// a snapshot follows) or a relayed "run:..." event. LogID is the change's,
// batch's or snapshot's log_id (0 for the others).
type FeedEvent struct {
	Name    string
	LogID   uint64
	Payload json.RawMessage
}

// Feed is an object's live feed as a Go channel. C yields the snapshot, then
// every change in order, each once; when the object drops the subscription
// (its activation failed) or C's reader falls more than feedBuffer events
// behind, the feed subscribes again after the last log_id it handed out, so
// that nothing is skipped or repeated (or says log_truncated). C closes when
// the context ends or Close is called; Err says why.
type Feed struct {
	C <-chan FeedEvent

	c      chan FeedEvent
	cancel context.CancelFunc
	done   chan struct{}

	mu      sync.Mutex
	queue   []actors.Event
	wake    chan struct{} // buffered 1: queue has events, or the subscription ended
	dropped bool          // the subscription ended (Lost, or the queue overflowed)
	err     error
}

// feedBuffer bounds the events a feed holds for a slow reader of C (a
// variable for tests).
var feedBuffer = 10_000

// Watch follows object (app, typ, key)'s live feed until ctx ends or Close.
// Its goroutine belongs to the Feed: Close stops it and waits.
func (r *Runtime) Watch(ctx context.Context, app, typ, key string) (*Feed, error) {
	id := ObjectID{App: app, Type: typ, Key: key}
	ctx, cancel := context.WithCancel(ctx)
	f := &Feed{c: make(chan FeedEvent), cancel: cancel, done: make(chan struct{}), wake: make(chan struct{}, 1)}
	f.C = f.c
	sub := &feedSub{f: f}
	if _, err := r.node.Request(ctx, id, actors.KVSubscribe{Sub: sub}); err != nil {
		cancel()
		return nil, err
	}
	go f.run(ctx, r, id, sub)
	return f, nil
}

// Close ends the feed and waits for its goroutine; C closes.
func (f *Feed) Close() {
	f.cancel()
	<-f.done
}

// Err is why C closed: the context's error, or a failed rejoin's.
func (f *Feed) Err() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.err
}

// feedSub is one subscription of a feed; a rejoin makes a new one, so that
// events of an old one that arrive late are told apart.
type feedSub struct {
	f    *Feed
	gone bool // under f.mu: no longer the feed's subscription
}

func (s *feedSub) Deliver(ev actors.Event) {
	f := s.f
	f.mu.Lock()
	defer f.mu.Unlock()
	if s.gone || f.dropped {
		return
	}
	if len(f.queue) >= feedBuffer {
		f.dropped = true // the reader fell behind: rejoin once it catches up
	} else {
		f.queue = append(f.queue, ev)
	}
	select {
	case f.wake <- struct{}{}:
	default:
	}
}

func (s *feedSub) Lost(error) {
	f := s.f
	f.mu.Lock()
	if !s.gone {
		f.dropped = true
	}
	f.mu.Unlock()
	select {
	case f.wake <- struct{}{}:
	default:
	}
}

// run hands the queued events to C and rejoins a dropped subscription after
// the last log_id handed out.
func (f *Feed) run(ctx context.Context, r *Runtime, id ObjectID, sub *feedSub) {
	defer close(f.done)
	defer close(f.c)
	defer func() {
		_, _ = r.node.Request(context.Background(), id, actors.KVUnsubscribe{Sub: sub})
	}()
	var last uint64 // the last change's or snapshot's log_id handed out
	for {
		f.mu.Lock()
		evs, dropped := f.queue, f.dropped
		f.queue = nil
		f.mu.Unlock()
		for _, ev := range evs {
			out, ok := feedEvent(ev)
			if !ok {
				continue
			}
			select {
			case f.c <- out:
				if out.LogID != 0 {
					last = out.LogID
				}
			case <-ctx.Done():
				f.fail(ctx.Err())
				return
			}
		}
		if dropped && len(evs) == 0 {
			f.mu.Lock()
			sub.gone = true
			f.dropped = false
			f.mu.Unlock()
			_, _ = r.node.Request(ctx, id, actors.KVUnsubscribe{Sub: sub})
			sub = &feedSub{f: f}
			after := last
			if _, err := r.node.Request(ctx, id, actors.KVSubscribe{Sub: sub, After: &after}); err != nil {
				f.fail(err)
				return
			}
			continue
		}
		if len(evs) > 0 {
			continue // more may have come meanwhile
		}
		select {
		case <-f.wake:
		case <-ctx.Done():
			f.fail(ctx.Err())
			return
		}
	}
}

func (f *Feed) fail(err error) {
	f.mu.Lock()
	if f.err == nil {
		f.err = err
	}
	f.mu.Unlock()
}

// feedEvent turns a subscription's event into a FeedEvent; ok is false for
// the ones a feed does not hand out (the subscription's registration).
func feedEvent(ev actors.Event) (FeedEvent, bool) {
	switch ev.Kind {
	case actors.EventJoined:
		return FeedEvent{}, false
	case actors.EventReplay, actors.EventSnapshot:
		var p struct {
			LogID uint64 `json:"log_id"`
		}
		if err := json.Unmarshal(ev.Payload, &p); err != nil {
			return FeedEvent{}, false
		}
		name := "change"
		if ev.Kind == actors.EventSnapshot {
			name = "snapshot"
		}
		return FeedEvent{Name: name, LogID: p.LogID, Payload: ev.Payload}, true
	}
	return FeedEvent{Name: ev.Name, LogID: ev.LogID, Payload: ev.Payload}, true
}
