package actors

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"time"

	"github.com/holdfast/holdfast/persistence"
)

// Leases (spec/log.md, "Leases"): durable range claims for parallel consumers.
//
// Per consumer, in the log's keyspace:
//
//	'L' | consumer | '/' | first (u64 BE)   a range: last, attempt, expiry, state, batch id
//	'A' | consumer                          the next offset never leased
//	'X' | consumer | '/' | first (u64 BE)   a dead letter: last, attempts, the records (JSON)
//
// A range stays until the cursor passes it; the ranges of a consumer are held in
// memory while the object is active. Every lease, ack and nack is one durable
// commit before its reply.
const (
	logRange byte = 'L'
	logAlloc byte = 'A'
	logDead  byte = 'X'

	rangeVersion byte = 1
)

// Range states.
const (
	rangeActive  byte = 1
	rangeNacked  byte = 2
	rangeSettled byte = 3 // acked, dead-lettered, or dropped after a trim
)

// LeaseOptions are a type's lease settings (spec/config.md, log.leases).
type LeaseOptions struct {
	MaxParallelism int           // ranges one consumer may hold; zero means 1
	LeaseDuration  time.Duration // zero means 30s
	MaxAttempts    int           // deliveries before dead-lettering; zero means unlimited
}

// Messages of the lease API.

// LogLease claims a range for Consumer (at most Limit records, 0: MaxBatchSize).
// Reply: *Lease, or nil when nothing is available now.
type LogLease struct {
	Consumer string
	Limit    int
}

// Lease is a claimed range.
type Lease struct {
	BatchID     string      `json:"batchId"`
	Consumer    string      `json:"consumer"`
	Records     []LogRecord `json:"records"`
	FirstOffset uint64      `json:"firstOffset"`
	LastOffset  uint64      `json:"lastOffset"`
	Attempt     int         `json:"attempt"`
	ExpiresAt   int64       `json:"expiresAt"` // unix milliseconds
}

// LogAck settles a range. Reply: *AckResult.
type LogAck struct{ Consumer, BatchID string }

// AckResult is the cursor after an ack, or nil when the ack moved nothing.
type AckResult struct {
	Cursor *uint64 `json:"cursor"`
}

// LogNack makes a range redeliverable at once. Reply: *struct{}.
type LogNack struct{ Consumer, BatchID string }

// LogLeasesGet lists a consumer's ranges. Reply: *LeaseList.
type LogLeasesGet struct{ Consumer string }

// LeaseList is a consumer's ranges not yet passed by its cursor.
type LeaseList struct {
	Leases []LeaseInfo `json:"leases"`
}

// LeaseInfo describes one range.
type LeaseInfo struct {
	BatchID     string `json:"batchId"`
	FirstOffset uint64 `json:"firstOffset"`
	LastOffset  uint64 `json:"lastOffset"`
	State       string `json:"state"` // active, expired, nacked, settled
	Attempt     int    `json:"attempt"`
	ExpiresAt   int64  `json:"expiresAt"`
}

// LogDeadLettersGet lists a consumer's dead letters. Reply: *DeadLetters.
type LogDeadLettersGet struct{ Consumer string }

// DeadLetters are a consumer's poison ranges.
type DeadLetters struct {
	DeadLetters []DeadLetter `json:"deadLetters"`
}

// DeadLetter is a range that failed MaxAttempts deliveries, with its records.
type DeadLetter struct {
	FirstOffset uint64      `json:"firstOffset"`
	LastOffset  uint64      `json:"lastOffset"`
	Attempts    int         `json:"attempts"`
	Records     []LogRecord `json:"records"`
}

// Errors of the lease API (HTTP 409 with these codes).
var (
	ErrLeaseNotHeld   = &Error{Kind: KindConflict, Code: "lease_not_held", Msg: "the batch is not held by this consumer"}
	ErrLeasesDisabled = &Error{Kind: KindConflict, Code: "leases_disabled", Msg: "this object type has no leases"}
)

type leaseRange struct {
	first, last uint64
	batchID     string
	attempt     int
	expiresAt   int64
	state       byte
}

type consumerLeases struct {
	alloc  uint64
	ranges []*leaseRange // by first offset
}

func (r *leaseRange) value() []byte {
	b := make([]byte, 0, 30+len(r.batchID))
	b = append(b, rangeVersion)
	b = binary.BigEndian.AppendUint64(b, r.last)
	b = binary.BigEndian.AppendUint32(b, uint32(r.attempt))
	b = binary.BigEndian.AppendUint64(b, uint64(r.expiresAt))
	b = append(b, r.state)
	return append(b, r.batchID...)
}

func decodeRange(first uint64, v []byte) (*leaseRange, error) {
	if len(v) < 22 || v[0] != rangeVersion {
		return nil, fmt.Errorf("lease range %d: bad encoding", first)
	}
	return &leaseRange{first: first, last: binary.BigEndian.Uint64(v[1:]), attempt: int(binary.BigEndian.Uint32(v[9:])),
		expiresAt: int64(binary.BigEndian.Uint64(v[13:])), state: v[21], batchID: string(v[22:])}, nil
}

func rangeKey(l *logState, consumer string, first uint64) []byte {
	return l.ks.KeyString(logRange, consumer+"/"+string(binary.BigEndian.AppendUint64(nil, first)))
}

func deadKey(l *logState, consumer string, first uint64) []byte {
	return l.ks.KeyString(logDead, consumer+"/"+string(binary.BigEndian.AppendUint64(nil, first)))
}

func (o *object) leaseOpts() (LeaseOptions, error) {
	lo := o.opts.Log.Leases
	if lo == nil {
		return LeaseOptions{}, ErrLeasesDisabled
	}
	out := *lo
	if out.MaxParallelism < 1 {
		out.MaxParallelism = 1
	}
	if out.LeaseDuration <= 0 {
		out.LeaseDuration = 30 * time.Second
	}
	return out, nil
}

// consumerLoad returns consumer's ranges, loading them on first use.
func (o *object) consumerLoad(l *logState, consumer string) (*consumerLeases, error) {
	if c := l.leases[consumer]; c != nil {
		return c, nil
	}
	c := &consumerLeases{}
	v, found, err := o.st.get(o.bg(), l.ks.KeyString(logAlloc, consumer))
	if err != nil {
		return nil, unavailable("cannot load the consumer's leases", err)
	}
	if found && len(v) == 8 {
		c.alloc = binary.BigEndian.Uint64(v)
	}
	prefix := l.ks.KeyString(logRange, consumer+"/")
	err = o.st.scan(o.bg(), prefix, nil, nil, func(key, value []byte) (bool, error) {
		r, err := decodeRange(binary.BigEndian.Uint64(key[len(prefix):]), value)
		if err != nil {
			return false, err
		}
		c.ranges = append(c.ranges, r)
		return true, nil
	})
	if err != nil {
		return nil, unavailable("cannot load the consumer's leases", err)
	}
	if l.leases == nil {
		l.leases = map[string]*consumerLeases{}
	}
	l.leases[consumer] = c
	return c, nil
}

func newBatchID() string {
	var b [12]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(err) // crypto/rand does not fail on Linux
	}
	return hex.EncodeToString(b[:])
}

// resume runs fn in the object's turn (sent by a goroutine that finished slow work).
type resume struct{ fn func() }

// recordsOf returns the records [first, last] to fn: in the turn when they are
// hot, else after reading their segments off the turn (fn then runs in a later
// turn). A missing or damaged segment is an *OffsetTruncatedError.
func (o *object) recordsOf(l *logState, first, last uint64, fn func([]LogRecord, error)) {
	if first >= l.hot {
		var recs []LogRecord
		err := o.scanBlocks(l, first, func(b *block) bool {
			for i := range b.recs {
				if off := b.first + uint64(i); off >= first && off <= last {
					recs = append(recs, b.record(i))
				}
			}
			return b.end() <= last
		})
		if err != nil {
			fn(nil, unavailable("cannot read the log", err))
			return
		}
		fn(recs, nil)
		return
	}
	// Some are cold: find their segments now, read them off the turn.
	prefix := l.ks.Key(logSegment, nil)
	var segs []segEntry
	k, v, found, err := o.st.floor(o.bg(), prefix, l.ks.KeyUint64(logSegment, first))
	if err == nil && found {
		e, derr := decodeSegEntry(binary.BigEndian.Uint64(k[len(prefix):]), v)
		if derr == nil && e.end > first {
			segs = append(segs, e)
		}
		err = o.st.scan(o.bg(), prefix, l.ks.KeyUint64(logSegment, first+1), l.ks.KeyUint64(logSegment, min(last+1, l.hot)), func(key, value []byte) (bool, error) {
			e, err := decodeSegEntry(binary.BigEndian.Uint64(key[len(prefix):]), value)
			if err != nil {
				return false, err
			}
			segs = append(segs, e)
			return true, nil
		})
	}
	if err != nil {
		fn(nil, unavailable("cannot read the segment index", err))
		return
	}
	var hot []LogRecord
	if last >= l.hot {
		o.recordsOf(l, l.hot, last, func(r []LogRecord, e error) { hot, err = r, e })
		if err != nil {
			fn(nil, err)
			return
		}
	}
	store, timeout, h, act := o.h.cfg.Cold, o.h.cfg.ColdTimeout, o.h, o.act
	if store == nil {
		fn(nil, unavailable("this node has no cold store", nil))
		return
	}
	// On a goroutine of h.bg (owners.go).
	if !h.bg.Go(func(ctx context.Context) {
		var recs []LogRecord
		var err error
		next := first
		for _, e := range segs {
			if e.first > next {
				break // a gap: forgotten
			}
			var page *RecordPage
			page, err = readSegment(ctx, store, timeout, e, next, int(min(last, e.end-1)-next+1), 0)
			if err != nil {
				break
			}
			recs = append(recs, page.Records...)
			next = page.NextOffset
		}
		if err == nil && next < min(last+1, l.hot) {
			err = &OffsetTruncatedError{Requested: next, Oldest: l.hot}
		}
		recs = append(recs, hot...)
		h.send(act, resume{fn: func() { fn(recs, err) }}, false)
	}) {
		fn(nil, errClosing())
	}
}

func (o *object) logLease(m LogLease) (any, error) {
	if m.Limit < 0 {
		return nil, badRequestf("limit must be at least 1")
	}
	l, c, err := o.leaseConsumer(m.Consumer)
	if err != nil {
		return nil, err
	}
	lo, _ := o.leaseOpts()
	now := o.h.now().UnixMilli()
	w := &persistence.Write{}

	// 1. Redeliver the oldest nacked or expired range first.
	for _, r := range c.ranges {
		if !(r.state == rangeNacked || (r.state == rangeActive && r.expiresAt <= now)) {
			continue
		}
		if r.first < l.oldest {
			// Trimmed without cold storage: fail once, drop what is gone, go on.
			terr := &OffsetTruncatedError{Requested: r.first, Oldest: l.oldest}
			w.Deletes = append(w.Deletes, rangeKey(l, m.Consumer, r.first))
			if r.last < l.oldest {
				r.state = rangeSettled
			} else {
				r.first = l.oldest
			}
			w.Sets = append(w.Sets, persistence.KV{Key: rangeKey(l, m.Consumer, r.first), Value: r.value()})
			// The cursor moves up to what is left, unless another range below is held.
			if cur := l.cursors[m.Consumer]; cur < l.oldest {
				below := false
				for _, x := range c.ranges {
					below = below || (x != r && x.first < l.oldest && x.state != rangeSettled)
				}
				if !below {
					l.cursors[m.Consumer] = l.oldest
					w.Sets = append(w.Sets, persistence.KV{Key: l.ks.KeyString(logCursor, m.Consumer), Value: binary.BigEndian.AppendUint64(nil, l.oldest)})
				}
			}
			o.foldCursor(l, c, m.Consumer, w)
			o.submit(w, l.readBack)
			return nil, terr
		}
		if lo.MaxAttempts > 0 && r.attempt+1 > lo.MaxAttempts {
			o.deadLetter(l, c, m.Consumer, r)
			return o.logLease(m) // carry on with what is left
		}
		r.attempt++
		r.batchID = newBatchID() // fences the previous holder
		r.state = rangeActive
		r.expiresAt = now + lo.LeaseDuration.Milliseconds()
		w.Sets = append(w.Sets, persistence.KV{Key: rangeKey(l, m.Consumer, r.first), Value: r.value()})
		o.submit(w, l.readBack)
		return o.deliver(l, m.Consumer, *r)
	}
	// 2. At most MaxParallelism ranges held (active and unexpired, or nacked).
	held := 0
	for _, r := range c.ranges {
		if r.state == rangeNacked || (r.state == rangeActive && r.expiresAt > now) {
			held++
		}
	}
	if held >= lo.MaxParallelism {
		return nil, nil
	}
	// 3. The next never-leased records.
	cur, hasCursor := l.cursors[m.Consumer]
	start := max(l.oldest, cur, c.alloc)
	if start >= l.next {
		return nil, nil
	}
	limit := m.Limit
	if limit == 0 || limit > o.maxBatch() {
		limit = o.maxBatch()
	}
	end := min(l.next, start+uint64(limit))
	if start < l.hot {
		end = min(end, l.hot) // a range never spans the cold and the hot parts
		if e, ok := o.segmentHolding(l, start); ok {
			end = min(end, e.end)
		}
	}
	if !hasCursor || cur < l.oldest {
		// The cursor starts where leasing starts: above 0 when history was trimmed
		// before anyone leased it.
		base := max(l.oldest, c.alloc)
		if !hasCursor || base > cur {
			l.cursors[m.Consumer] = base
			w.Sets = append(w.Sets, persistence.KV{Key: l.ks.KeyString(logCursor, m.Consumer), Value: binary.BigEndian.AppendUint64(nil, base)})
		}
	}
	r := &leaseRange{first: start, last: end - 1, batchID: newBatchID(), attempt: 1, expiresAt: now + lo.LeaseDuration.Milliseconds(), state: rangeActive}
	c.ranges = append(c.ranges, r)
	sort.Slice(c.ranges, func(i, j int) bool { return c.ranges[i].first < c.ranges[j].first })
	c.alloc = end
	w.Sets = append(w.Sets,
		persistence.KV{Key: rangeKey(l, m.Consumer, r.first), Value: r.value()},
		persistence.KV{Key: l.ks.KeyString(logAlloc, m.Consumer), Value: binary.BigEndian.AppendUint64(nil, end)},
	)
	o.submit(w, l.readBack)
	return o.deliver(l, m.Consumer, *r)
}

// segmentHolding returns the index entry of the segment holding off.
func (o *object) segmentHolding(l *logState, off uint64) (segEntry, bool) {
	prefix := l.ks.Key(logSegment, nil)
	k, v, found, err := o.st.floor(o.bg(), prefix, l.ks.KeyUint64(logSegment, off))
	if err != nil || !found {
		return segEntry{}, false
	}
	e, err := decodeSegEntry(binary.BigEndian.Uint64(k[len(prefix):]), v)
	if err != nil || e.end <= off {
		return segEntry{}, false
	}
	return e, true
}

// deliver replies with the lease of r (a copy) once its records are read; the
// reply leaves after the claim is durable.
func (o *object) deliver(l *logState, consumer string, r leaseRange) (any, error) {
	lease := &Lease{BatchID: r.batchID, Consumer: consumer, FirstOffset: r.first, LastOffset: r.last, Attempt: r.attempt, ExpiresAt: r.expiresAt}
	env := o.deferReply()
	o.recordsOf(l, r.first, r.last, func(recs []LogRecord, err error) {
		if err == nil && uint64(len(recs)) != r.last-r.first+1 {
			err = &OffsetTruncatedError{Requested: r.first, Oldest: l.oldest}
		}
		if err != nil {
			o.respond(env, nil, err)
			return
		}
		lease.Records = recs
		o.respond(env, lease, nil)
	})
	return nil, nil
}

// deadLetter moves a poison range to the consumer's dead letters with its
// records, settles it, and reports it.
func (o *object) deadLetter(l *logState, c *consumerLeases, consumer string, r *leaseRange) {
	r.state = rangeSettled // no one else redelivers it meanwhile
	first, last, attempts := r.first, r.last, r.attempt
	write := func(recs []LogRecord, err error) {
		if err != nil {
			o.h.log.Warn("dead letter without its records: they could not be read", "object", o.act.id.String(), "consumer", consumer, "first", first, "last", last, "err", err)
		}
		body, _ := json.Marshal(recs)
		v := make([]byte, 0, 13+len(body))
		v = append(v, rangeVersion)
		v = binary.BigEndian.AppendUint64(v, last)
		v = binary.BigEndian.AppendUint32(v, uint32(attempts))
		v = append(v, body...)
		w := &persistence.Write{Sets: []persistence.KV{
			{Key: deadKey(l, consumer, first), Value: v},
			{Key: rangeKey(l, consumer, first), Value: r.value()},
		}}
		o.foldCursor(l, c, consumer, w)
		o.submit(w, l.readBack)
		o.h.log.Warn("poison range moved to dead letters", "object", o.act.id.String(), "consumer", consumer, "first", first, "last", last, "attempts", attempts)
		if cb := o.opts.Log.OnPoison; cb != nil {
			cb(o.act.id, consumer, first, last, attempts)
		}
	}
	o.recordsOf(l, first, last, write)
}

// foldCursor moves the consumer's cursor over the unbroken run of settled ranges
// that starts at it, deleting them, and adds the changes to w. It returns whether
// the cursor moved.
func (o *object) foldCursor(l *logState, c *consumerLeases, consumer string, w *persistence.Write) bool {
	cur := l.cursors[consumer]
	moved := false
	keep := c.ranges[:0]
	for _, r := range c.ranges {
		switch {
		case r.last < cur && r.state == rangeSettled: // passed already
			w.Deletes = append(w.Deletes, rangeKey(l, consumer, r.first))
		case r.first <= cur && r.state == rangeSettled:
			cur, moved = r.last+1, true
			w.Deletes = append(w.Deletes, rangeKey(l, consumer, r.first))
		default:
			keep = append(keep, r)
		}
	}
	c.ranges = keep
	if moved {
		l.cursors[consumer] = cur
		w.Sets = append(w.Sets, persistence.KV{Key: l.ks.KeyString(logCursor, consumer), Value: binary.BigEndian.AppendUint64(nil, cur)})
	}
	return moved
}

// settle acks or nacks the range holding batchID.
func (o *object) settle(consumer, batchID string, ack bool) (any, error) {
	l, c, err := o.leaseConsumer(consumer)
	if err != nil {
		return nil, err
	}
	var r *leaseRange
	for _, x := range c.ranges {
		if x.batchID == batchID && batchID != "" {
			r = x
		}
	}
	// An expired range nobody reclaimed yet keeps its batch id: it may be settled.
	if r == nil || r.state != rangeActive {
		return nil, ErrLeaseNotHeld
	}
	w := &persistence.Write{}
	if !ack {
		r.state = rangeNacked
		w.Sets = append(w.Sets, persistence.KV{Key: rangeKey(l, consumer, r.first), Value: r.value()})
		o.submit(w, l.readBack)
		return &struct{}{}, nil
	}
	r.state = rangeSettled
	w.Sets = append(w.Sets, persistence.KV{Key: rangeKey(l, consumer, r.first), Value: r.value()})
	res := &AckResult{}
	if o.foldCursor(l, c, consumer, w) {
		cur := l.cursors[consumer]
		res.Cursor = &cur
	}
	o.submit(w, l.readBack)
	return res, nil
}

// leaseConsumer checks that the type has leases and the consumer's name, and
// loads the log and the consumer's ranges.
func (o *object) leaseConsumer(consumer string) (*logState, *consumerLeases, error) {
	if _, err := o.leaseOpts(); err != nil {
		return nil, nil, err
	}
	if err := checkConsumer(consumer); err != nil {
		return nil, nil, err
	}
	l, err := o.logLoad()
	if err != nil {
		return nil, nil, err
	}
	c, err := o.consumerLoad(l, consumer)
	if err != nil {
		return nil, nil, err
	}
	return l, c, nil
}

func (o *object) logLeases(m LogLeasesGet) (any, error) {
	_, c, err := o.leaseConsumer(m.Consumer)
	if err != nil {
		return nil, err
	}
	now := o.h.now().UnixMilli()
	out := &LeaseList{Leases: []LeaseInfo{}}
	for _, r := range c.ranges {
		state := map[byte]string{rangeActive: "active", rangeNacked: "nacked", rangeSettled: "settled"}[r.state]
		if r.state == rangeActive && r.expiresAt <= now {
			state = "expired"
		}
		out.Leases = append(out.Leases, LeaseInfo{BatchID: r.batchID, FirstOffset: r.first, LastOffset: r.last, State: state, Attempt: r.attempt, ExpiresAt: r.expiresAt})
	}
	return out, nil
}

func (o *object) logDeadLetters(m LogDeadLettersGet) (any, error) {
	l, _, err := o.leaseConsumer(m.Consumer)
	if err != nil {
		return nil, err
	}
	out := &DeadLetters{DeadLetters: []DeadLetter{}}
	prefix := l.ks.KeyString(logDead, m.Consumer+"/")
	err = o.st.scan(o.bg(), prefix, nil, nil, func(key, v []byte) (bool, error) {
		if len(v) < 13 || v[0] != rangeVersion {
			return false, errors.New("dead letter: bad encoding")
		}
		d := DeadLetter{FirstOffset: binary.BigEndian.Uint64(key[len(prefix):]), LastOffset: binary.BigEndian.Uint64(v[1:]), Attempts: int(binary.BigEndian.Uint32(v[9:]))}
		if err := json.Unmarshal(v[13:], &d.Records); err != nil {
			return false, err
		}
		if d.Records == nil {
			d.Records = []LogRecord{}
		}
		out.DeadLetters = append(out.DeadLetters, d)
		return true, nil
	})
	if err != nil {
		return nil, unavailable("cannot read the dead letters", err)
	}
	return out, nil
}
