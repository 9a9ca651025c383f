package actors

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand"
	"os"
	"sort"
	"strconv"
	"testing"
	"time"
)

// A seeded random test of the queue's state machine against a simple model:
// enqueues (ids from a small pool, so retries deduplicate; delays; topics),
// receives (targets, topic filters, max), acks (current, stale and repeated
// receipts), nacks with delays, dead-lettering, the clock moving, and every
// reply, every message's pairs and the stats compared with the model's.
// HOLDFAST_QUEUE_SEED picks the seed (CI runs several).

type modelPair struct {
	state             string
	attempts          int
	class             byte
	due, deadline     int64
	receipt           string
	lastError, reason string
}

type modelMsg struct {
	topic   string
	payload string
	seq     int
}

type queueModel struct {
	opts    QueueOptions
	msgs    map[string]*modelMsg
	pairs   map[string]map[string]*modelPair // target -> id -> pair
	seq     int
	pending int
}

func (m *queueModel) backoff(n int) int64 { return m.opts.backoff(n, 0).Milliseconds() }

func (m *queueModel) fail(p *modelPair, delay time.Duration, lastErr string, now int64) {
	p.receipt, p.deadline, p.lastError = "", 0, lastErr
	if p.attempts >= m.opts.MaxAttempts {
		p.state, p.reason = StateFailed, "exhausted"
		return
	}
	p.state, p.class, p.due = StatePending, classRetry, now+max(delay.Milliseconds(), m.backoff(p.attempts))
	m.pending++
}

// expire fails a delivery whose visibility deadline passed: due at the
// deadline plus the backoff, or now if that has passed too.
func (m *queueModel) expire(p *modelPair, now int64) {
	due := max(now, p.deadline+m.backoff(p.attempts))
	m.fail(p, 0, "visibility timeout passed", now)
	if p.state == StatePending {
		p.due = due
	}
}

// held returns the pair the receipt holds now, or nil.
func (m *queueModel) held(receipt string, now int64) *modelPair {
	for _, ps := range m.pairs {
		for _, p := range ps {
			if p.state == StateProcessing && p.receipt == receipt && p.deadline > now {
				return p
			}
		}
	}
	return nil
}

func TestQueue_RandomModel(t *testing.T) {
	seed := int64(1)
	if s := os.Getenv("HOLDFAST_QUEUE_SEED"); s != "" {
		seed, _ = strconv.ParseInt(s, 10, 64)
	}
	rng := rand.New(rand.NewSource(seed))
	opts := QueueOptions{Targets: []string{"t1", "t2"}, MaxAttempts: 3, VisibilityTimeout: 2 * time.Second,
		Backoff: Backoff{Initial: time.Second, Multiplier: 2, Max: 4 * time.Second}, MaxPending: 24}
	n := startQueueNode(t, t.TempDir(), opts)
	m := &queueModel{opts: opts.withDefaults(), msgs: map[string]*modelMsg{}, pairs: map[string]map[string]*modelPair{"t1": {}, "t2": {}}}
	ctx := context.Background()
	var receipts []string // every receipt handed out, current or not
	topics := []string{"a", "b"}
	seen := map[string]int{} // what happened, so that a run that exercises nothing fails

	for step := 0; step < 3000; step++ {
		now := n.clock.Load()
		where := fmt.Sprintf("seed %d step %d", seed, step)
		switch op := rng.Intn(100); {
		case op < 25: // enqueue
			var in []QueueMessageIn
			for range 1 + rng.Intn(3) {
				in = append(in, QueueMessageIn{ID: fmt.Sprintf("m%d", rng.Intn(pool(step))), Topic: topics[rng.Intn(2)],
					Payload: json.RawMessage(strconv.Itoa(rng.Intn(1000))), Delay: time.Duration(rng.Intn(3)) * time.Second})
			}
			newPairs, inBatch := 0, map[string]bool{}
			for _, x := range in {
				if m.msgs[x.ID] == nil && !inBatch[x.ID] {
					newPairs += 2
				}
				inBatch[x.ID] = true
			}
			got, err := n.q.Enqueue(ctx, in...)
			if newPairs > 0 && m.pending+newPairs > opts.MaxPending {
				if !errors.Is(err, ErrOverloaded) {
					t.Fatalf("%s: enqueue past maxPending: %v", where, err)
				}
				seen["refused at maxPending"]++
				continue
			}
			if err != nil {
				t.Fatalf("%s: enqueue: %v", where, err)
			}
			for i, x := range in {
				if got[i] != x.ID {
					t.Fatalf("%s: ids %v", where, got)
				}
				if m.msgs[x.ID] != nil {
					seen["deduplicated"]++
					continue
				}
				m.seq++
				m.msgs[x.ID] = &modelMsg{topic: x.Topic, payload: string(x.Payload), seq: m.seq}
				for _, target := range opts.Targets {
					m.pairs[target][x.ID] = &modelPair{state: StatePending, class: classFirst, due: now + x.Delay.Milliseconds()}
					m.pending++
				}
			}
		case op < 50: // receive
			target := opts.Targets[rng.Intn(2)]
			topic := ""
			if rng.Intn(3) == 0 {
				topic = topics[rng.Intn(2)]
			}
			limit := 1 + rng.Intn(3)
			got, err := n.q.Receive(ctx, QueueReceive{Target: target, Topic: topic, Max: limit})
			if err != nil {
				t.Fatalf("%s: receive: %v", where, err)
			}
			for _, p := range m.pairs[target] {
				if p.state == StateProcessing && p.deadline <= now {
					m.expire(p, now)
					seen["expired"]++
				}
			}
			var due []string
			for id, p := range m.pairs[target] {
				if p.state == StatePending && p.due <= now && (topic == "" || m.msgs[id].topic == topic) {
					due = append(due, id)
				}
			}
			sort.Slice(due, func(i, j int) bool {
				a, b := m.pairs[target][due[i]], m.pairs[target][due[j]]
				if a.class != b.class {
					return a.class < b.class
				}
				if a.due != b.due {
					return a.due < b.due
				}
				return m.msgs[due[i]].seq < m.msgs[due[j]].seq
			})
			due = due[:min(len(due), limit)]
			if len(got) != len(due) {
				t.Fatalf("%s: received %s, model %v", where, ids(got), due)
			}
			for i, d := range got {
				p := m.pairs[target][due[i]]
				if d.ID != due[i] || d.Attempt != p.attempts+1 || string(d.Payload) != m.msgs[d.ID].payload || d.Topic != m.msgs[d.ID].topic {
					t.Fatalf("%s: received %+v, model %s attempt %d", where, d, due[i], p.attempts+1)
				}
				p.state, p.attempts, p.deadline, p.receipt = StateProcessing, p.attempts+1, now+opts.VisibilityTimeout.Milliseconds(), d.Receipt
				m.pending--
				receipts = append(receipts, d.Receipt)
				seen[fmt.Sprintf("delivered (attempt %d)", d.Attempt)]++
			}
		case op < 65 && len(receipts) > 0: // ack a few receipts, current or stale
			var rs []string
			for range 1 + rng.Intn(3) {
				rs = append(rs, pick(rng, receipts))
			}
			want := QueueAcked{}
			for i, r := range rs {
				p := m.held(r, now)
				if p == nil || containsBefore(rs, i) {
					want.NotHeld++
					continue
				}
				p.state, p.receipt, p.deadline = StateComplete, "", 0
				want.Acked++
				seen["acked"]++
			}
			got, err := n.q.Ack(ctx, rs...)
			if err != nil || *got != want {
				t.Fatalf("%s: ack %+v %v, model %+v", where, got, err, want)
			}
		case op < 75 && len(receipts) > 0: // nack
			r := pick(rng, receipts)
			delay := time.Duration(rng.Intn(3)) * time.Second
			got, err := n.q.Nack(ctx, QueueNack{Receipt: r, Delay: delay, Error: "e" + strconv.Itoa(step)})
			p := m.held(r, now)
			if p == nil {
				if !errors.Is(err, ErrReceiptNotHeld) {
					t.Fatalf("%s: nack of a receipt not held: %v", where, err)
				}
				continue
			}
			m.fail(p, delay, "e"+strconv.Itoa(step), now)
			seen["nacked to "+p.state]++
			if err != nil || got.State != p.state {
				t.Fatalf("%s: nack %+v %v, model %s", where, got, err, p.state)
			}
		case op < 80 && len(receipts) > 0: // dead
			r := pick(rng, receipts)
			_, err := n.q.Dead(ctx, QueueDead{Receipt: r, Reason: "bad"})
			p := m.held(r, now)
			if p == nil {
				if !errors.Is(err, ErrReceiptNotHeld) {
					t.Fatalf("%s: dead of a receipt not held: %v", where, err)
				}
				continue
			}
			p.state, p.reason, p.lastError, p.receipt, p.deadline = StateFailed, "rejected", "bad", "", 0
			seen["dead-lettered"]++
			if err != nil {
				t.Fatalf("%s: dead: %v", where, err)
			}
		case op < 83: // redrive one id or everything
			var rids []string
			if rng.Intn(3) > 0 {
				rids = []string{fmt.Sprintf("m%d", rng.Intn(pool(step)))}
			}
			want := 0
			for _, ps := range m.pairs {
				for id, p := range ps {
					if p.state == StateFailed && (rids == nil || id == rids[0]) {
						p.state, p.attempts, p.class, p.due, p.reason = StatePending, 0, classFirst, now, ""
						m.pending++
						want++
					}
				}
			}
			got, err := n.q.Redrive(ctx, rids...)
			if err != nil || got != want {
				t.Fatalf("%s: redrive %v: %d %v, model %d", where, rids, got, err, want)
			}
			if want > 0 {
				seen["redriven"]++
			}
		case op < 85: // delete a message's dead letters
			id := fmt.Sprintf("m%d", rng.Intn(pool(step)))
			var failed []string
			for _, ps := range m.pairs {
				for fid, p := range ps {
					if p.state == StateFailed {
						failed = append(failed, fid)
					}
				}
			}
			if len(failed) > 0 && rng.Intn(3) > 0 {
				sort.Strings(failed) // map order is random; the seed must decide
				id = failed[rng.Intn(len(failed))]
			}
			deleted, left := 0, 0
			for _, ps := range m.pairs {
				if p := ps[id]; p != nil && p.state == StateFailed {
					delete(ps, id)
					deleted++
				} else if p != nil {
					left++
				}
			}
			err := n.q.DeleteDeadLetter(ctx, id)
			if deleted == 0 {
				if !errors.Is(err, ErrNotFound) {
					t.Fatalf("%s: delete of %s without dead letters: %v", where, id, err)
				}
				continue
			}
			if err != nil {
				t.Fatalf("%s: delete %s: %v", where, id, err)
			}
			if left == 0 {
				delete(m.msgs, id)
			}
			seen["deleted"]++
		case op < 92: // time passes
			n.advance(time.Duration(rng.Intn(1500)) * time.Millisecond)
		default: // compare a message and the stats
			id := fmt.Sprintf("m%d", rng.Intn(pool(step)))
			got, err := n.q.Message(ctx, id)
			mm := m.msgs[id]
			if mm == nil {
				if !errors.Is(err, ErrNotFound) {
					t.Fatalf("%s: message %s not enqueued: %v", where, id, err)
				}
			} else {
				if err != nil {
					t.Fatalf("%s: message %s: %v", where, id, err)
				}
				if len(got.Targets) != countPairs(m, id) {
					t.Fatalf("%s: message %s has pairs %v, model %d", where, id, got.Targets, countPairs(m, id))
				}
				for _, target := range opts.Targets {
					p := m.pairs[target][id]
					if p == nil {
						continue
					}
					want := QueuePair{State: p.state, Attempts: p.attempts, LastError: p.lastError, Reason: p.reason}
					if p.state == StatePending {
						want.NextAttemptAt = p.due
					}
					if got.Targets[target] != want {
						t.Fatalf("%s: message %s target %s: %+v, model %+v", where, id, target, got.Targets[target], want)
					}
				}
			}
			// Stats expire the deliveries past their deadline first.
			for _, ps := range m.pairs {
				for _, p := range ps {
					if p.state == StateProcessing && p.deadline <= now {
						m.expire(p, now)
						seen["expired"]++
					}
				}
			}
			var want QueueStats
			for _, ps := range m.pairs {
				for _, p := range ps {
					switch p.state {
					case StatePending:
						if p.due <= now {
							want.Pending++
						} else {
							want.Delayed++
						}
					case StateProcessing:
						want.Processing++
					case StateComplete:
						want.Complete++
					case StateFailed:
						want.Failed++
					}
				}
			}
			if s := n.stats(t); s != want {
				t.Fatalf("%s: stats %+v, model %+v", where, s, want)
			}
			seen["compared"]++
		}
	}
	t.Logf("seed %d: %v", seed, seen)
	for _, what := range []string{"refused at maxPending", "deduplicated", "expired", "delivered (attempt 1)", "delivered (attempt 3)",
		"acked", "nacked to pending", "nacked to failed", "dead-lettered", "compared", "redriven", "deleted"} {
		if seen[what] == 0 {
			t.Errorf("seed %d: the run never saw %q", seed, what)
		}
	}
}

// countPairs counts the model's pairs of message id.
func countPairs(m *queueModel, id string) int {
	c := 0
	for _, ps := range m.pairs {
		if ps[id] != nil {
			c++
		}
	}
	return c
}

// pool is how many ids the enqueues of step draw from: new ones keep coming,
// and retries of earlier ones still deduplicate.
func pool(step int) int { return 20 + step/8 }

// pick returns one of the last few receipts handed out, mostly, or any.
func pick(rng *rand.Rand, receipts []string) string {
	if rng.Intn(4) == 0 {
		return receipts[rng.Intn(len(receipts))]
	}
	return receipts[max(0, len(receipts)-1-rng.Intn(6))]
}

// containsBefore says whether rs[i] appears earlier in rs.
func containsBefore(rs []string, i int) bool {
	for _, r := range rs[:i] {
		if r == rs[i] {
			return true
		}
	}
	return false
}
