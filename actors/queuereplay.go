package actors

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/holdfast/holdfast/persistence"
)

// Replay (spec/queue.md, "Replay"). Every receipt names the node run
// (Host.boot) that handed it out. When an object's queue is loaded, the pairs
// still processing under an earlier run go back to pending, due at once (the
// attempt counts; a pair whose attempts are spent goes to the dead letters).
// So that this happens when the node starts and not only when a consumer
// comes back, each partition keeps an index of the objects whose queues have
// deliveries in flight (indexQueues), written in the same commit
// as the change that starts or ends them; at start the host wakes each one.

// QueueReplay makes the pending pairs of Topics (every topic when empty) that
// are backing off due now. Reply: *ReplaySummary.
type QueueReplay struct{ Topics []string }

// queueStartReplay is the host's wake-up of an object listed in the index at
// start: the queue loads, which replays. Reply: *ReplaySummary.
type queueStartReplay struct{}

// ReplaySummary says what a replay did: Recovered pairs are pending and due
// (put back from processing, made due, or already due), Delayed pairs wait for
// their time, Errors name the pairs it could not read.
type ReplaySummary struct {
	Recovered int      `json:"recovered"`
	Delayed   int      `json:"delayed"`
	Errors    []string `json:"errors"`
}

func (s *ReplaySummary) add(o *ReplaySummary) {
	s.Recovered += o.Recovered
	s.Delayed += o.Delayed
	s.Errors = append(s.Errors, o.Errors...)
}

// receiptBoot returns the node run that handed out a receipt.
func receiptBoot(r string) string {
	if parts := strings.Split(r, "."); len(parts) == 4 {
		return parts[1]
	}
	return ""
}

func queueIndexKey(part uint32, id ObjectID) []byte {
	return persistence.AppendObjectID(persistence.PartitionIndexPrefix(part, indexQueues), id)
}

// queueReplayLoad puts back the pairs processing under an earlier run; it runs
// once per activation, from queueLoad.
func (o *object) queueReplayLoad(q *queueState) *ReplaySummary {
	sum := &ReplaySummary{Errors: []string{}}
	if q.meta.Processing == 0 {
		return sum
	}
	now := o.h.now().UnixMilli()
	t := newQueueTxn(q)
	returned := 0
	for _, target := range q.opts.Targets {
		prefix := targetKey(q.ks, queueVisible, target)
		var found []string
		err := o.st.scan(o.bg(), prefix, nil, nil, func(_, value []byte) (bool, error) {
			found = append(found, string(value))
			return true, nil
		})
		if err != nil {
			sum.Errors = append(sum.Errors, o.replayError(fmt.Sprintf("target %s: its deliveries in flight could not be read", target), err))
			continue
		}
		for _, id := range found {
			p, _, err := o.queueRead(q, target, id)
			if err != nil {
				sum.Errors = append(sum.Errors, o.replayError(fmt.Sprintf("target %s, message %s: could not be read", target, id), err))
				continue
			}
			if p.State != StateProcessing || receiptBoot(p.Receipt) == o.h.boot {
				continue
			}
			// Due at once: the attempt counts, but no backoff (the node stopped,
			// not the consumer).
			if t.endDelivery(target, id, p, "the node stopped during the delivery", now, now) {
				returned++
			}
		}
	}
	o.queueCommit(t)
	if returned == 0 && len(sum.Errors) == 0 {
		return sum
	}
	due, delayed, err := o.queueCountPending(q, now, nil)
	if err != nil {
		sum.Errors = append(sum.Errors, o.replayError("the pending messages could not be counted", err))
	}
	sum.Recovered, sum.Delayed = due, delayed
	return sum
}

// replayError logs err in full and returns what a summary tells the app: what
// failed, never the Go error chain (which names files and internals).
func (o *object) replayError(what string, err error) string {
	o.h.log.Warn("queue replay error", "object", o.act.id.String(), "what", what, "err", err)
	return what + "; see the node's log"
}

// queueCountPending counts the pending pairs due at now and those due later,
// of the topics given (every topic when empty).
func (o *object) queueCountPending(q *queueState, now int64, topics map[string]bool) (due, later int, err error) {
	for _, target := range q.opts.Targets {
		for _, class := range []byte{classFirst, classRetry} {
			prefix := targetKey(q.ks, queueReady, target, []byte{class})
			err := o.st.scan(o.bg(), prefix, nil, nil, func(key, value []byte) (bool, error) {
				if len(topics) > 0 {
					if topic, _, _ := strings.Cut(string(value), "\x00"); !topics[topic] {
						return true, nil
					}
				}
				if int64(binary.BigEndian.Uint64(key[len(prefix):])) <= now {
					due++
				} else {
					later++
				}
				return true, nil
			})
			if err != nil {
				return due, later, fmt.Errorf("count pending: %w", err)
			}
		}
	}
	return due, later, nil
}

// queueReplay serves QueueReplay.
func (o *object) queueReplay(m QueueReplay) (any, error) {
	q, err := o.queueLoad()
	if err != nil {
		return nil, err
	}
	topics := map[string]bool{}
	for _, t := range m.Topics {
		topics[t] = true
	}
	now := o.h.now().UnixMilli()
	t := newQueueTxn(q)
	sum := &ReplaySummary{Errors: []string{}}
	for _, target := range q.opts.Targets {
		prefix := targetKey(q.ks, queueReady, target, []byte{classRetry})
		type entry struct {
			key []byte
			id  string
		}
		var backing []entry
		err := o.st.scan(o.bg(), prefix, append(bytes.Clone(prefix), u64(now+1)...), nil, func(key, value []byte) (bool, error) {
			topic, id, _ := strings.Cut(string(value), "\x00")
			if len(topics) == 0 || topics[topic] {
				backing = append(backing, entry{bytes.Clone(key), id})
			}
			return true, nil
		})
		if err != nil {
			t.rollback()
			return nil, unavailable("cannot read the queue", err)
		}
		for _, e := range backing {
			p, _, err := o.queueRead(q, target, e.id)
			if err != nil {
				sum.Errors = append(sum.Errors, o.replayError(fmt.Sprintf("target %s, message %s: could not be read", target, e.id), err))
				continue
			}
			t.del(e.key)
			p.Due = now
			t.set(pairKey(q, target, e.id), p)
			t.w.Sets = append(t.w.Sets, persistence.KV{Key: readyKey(q, target, p), Value: []byte(p.Topic + "\x00" + e.id)})
		}
	}
	o.queueCommit(t)
	o.queuePump()
	// Count what is due and delayed now, in the topics asked for.
	if sum.Recovered, sum.Delayed, err = o.queueCountPending(q, now, topics); err != nil {
		return nil, unavailable("cannot read the queue", err)
	}
	return sum, nil
}

// replayState is the node's summary of the replay it ran at start, one per
// app: an app's credentials see only what the replay did to its own queues
// (issue 26). Failures that belong to no app (a partition whose index could
// not be read) are counted in every app's summary as one generic line, since
// any app may have had queues there.
type replayState struct {
	mu       sync.Mutex
	done     bool
	apps     map[string]*ReplaySummary
	unscoped []string
}

// ReplaySummary returns the summary of the queue replay the node ran when it
// started for the queues of app, and whether it has finished. Its errors are
// descriptions for a user; the underlying errors are in the node's log.
func (h *Host) ReplaySummary(app string) (ReplaySummary, bool) {
	h.replay.mu.Lock()
	defer h.replay.mu.Unlock()
	s := ReplaySummary{Errors: []string{}}
	if a := h.replay.apps[app]; a != nil {
		s.add(a)
	}
	s.Errors = append(s.Errors, h.replay.unscoped...)
	return s, h.replay.done
}

// replayQueues wakes every object of the node's partitions whose queue had
// deliveries in flight when the node stopped, and logs one summary.
func (h *Host) replayQueues() {
	defer h.swept.Done()
	r := h.replayPartitions(h.partitions())
	h.log.Info("queue replay", "objects", r.objects, "recovered", r.total.Recovered, "delayed", r.total.Delayed, "errors", len(r.total.Errors),
		"took", time.Since(r.start).Round(time.Millisecond))
	for _, e := range r.total.Errors {
		h.log.Warn("queue replay error", "error", e)
	}
	h.replay.mu.Lock()
	h.replay.apps, h.replay.unscoped, h.replay.done = r.apps, r.unscoped, true
	h.replay.mu.Unlock()
}

// TakeUp starts serving the alarms and queues of partition p, which this node
// just began to serve: the alarm scheduler reloads its index, and the queues
// whose deliveries were in flight under the previous owner are replayed.
func (h *Host) TakeUp(p uint32) {
	if h.closing.Load() {
		return
	}
	if h.sched != nil {
		h.sched.Reset()
	}
	// On a goroutine of h.bg (owners.go): h.swept may be waited on already.
	h.bg.Go(func(context.Context) {
		r := h.replayPartitions([]uint32{p})
		if r.objects > 0 || len(r.total.Errors) > 0 {
			h.log.Info("queue replay of a partition taken up", "partition", p, "objects", r.objects, "recovered", r.total.Recovered,
				"errors", len(r.total.Errors), "took", time.Since(r.start).Round(time.Millisecond))
			for _, e := range r.total.Errors {
				h.log.Warn("queue replay error", "partition", p, "error", e)
			}
		}
	})
}

// partitions returns the partitions this node serves.
func (h *Host) partitions() []uint32 {
	if h.cfg.Partitions != nil {
		return h.cfg.Partitions()
	}
	ps := make([]uint32, h.db.Partitions())
	for i := range ps {
		ps[i] = uint32(i)
	}
	return ps
}

// indexedObjects lists the objects in partition p's index kind, whose keys are
// the index prefix and an object id.
func (h *Host) indexedObjects(ctx context.Context, p uint32, kind byte) ([]ObjectID, error) {
	prefix := persistence.PartitionIndexPrefix(p, kind)
	var ids []ObjectID
	err := h.db.Scan(ctx, prefix, nil, nil, func(key, _ []byte) (bool, error) {
		id, rest, ok := persistence.DecodeObjectID(key[len(prefix):])
		if !ok || len(rest) != 0 {
			return false, fmt.Errorf("malformed index key %x", key)
		}
		ids = append(ids, id)
		return true, nil
	})
	return ids, err
}

// replayRun is what a replay of some partitions did: total has every error in
// full (for the log); apps and unscoped are what apps are shown.
type replayRun struct {
	total    ReplaySummary
	apps     map[string]*ReplaySummary
	unscoped []string
	objects  int
	start    time.Time
}

// replayPartitions replays the queues of the objects of parts that had
// deliveries in flight.
func (h *Host) replayPartitions(parts []uint32) replayRun {
	r := replayRun{total: ReplaySummary{Errors: []string{}}, apps: map[string]*ReplaySummary{}, start: time.Now()}
	app := func(id ObjectID) *ReplaySummary {
		a := r.apps[id.App]
		if a == nil {
			a = &ReplaySummary{Errors: []string{}}
			r.apps[id.App] = a
		}
		return a
	}
	for _, p := range parts {
		ids, err := h.indexedObjects(context.Background(), p, indexQueues)
		if err != nil {
			r.total.Errors = append(r.total.Errors, fmt.Sprintf("partition %d: %v", p, err))
			r.unscoped = append(r.unscoped, fmt.Sprintf("partition %d: its queues could not be listed; see the node's log", p))
		}
		for _, id := range ids {
			select {
			case <-h.stop:
				return r
			default:
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			reply, err := h.Request(ctx, id, queueStartReplay{})
			cancel()
			r.objects++
			if err != nil {
				r.total.Errors = append(r.total.Errors, fmt.Sprintf("%s: %v", id, err))
				a := app(id)
				a.Errors = append(a.Errors, fmt.Sprintf("%s/%s: the queue could not be replayed; see the node's log", id.Type, id.Key))
				continue
			}
			sum := reply.(*ReplaySummary)
			r.total.add(sum)
			a := app(id)
			a.Recovered += sum.Recovered
			a.Delayed += sum.Delayed
			for _, e := range sum.Errors {
				a.Errors = append(a.Errors, fmt.Sprintf("%s/%s: %s", id.Type, id.Key, e))
			}
		}
	}
	return r
}
