package actors

import (
	"encoding/json"
	"errors"
	"strconv"
)

// Subscriptions: an object's live feed (spec/objects.md, "Channel").
//
// A subscriber registers with the object in the object's turn. It then receives,
// in order: EventJoined, the replay of the change log after its resume point (or
// log_truncated), the snapshot, and every later change, each exactly once. Events
// leave only after the write they describe is durable: the object hands them to
// the output gate, the same one that holds replies. A subscriber registered at
// log_id M gets a snapshot at M; every write planned after its turn is M+1 or
// later and lists it among the receivers, so nothing is missed or repeated across
// the snapshot.

// EventKind says what an Event is.
type EventKind uint8

const (
	// EventJoined comes first: the subscription is registered. Its Payload is nil.
	EventJoined EventKind = iota + 1
	// EventReplay is one item of the change log after the resume point:
	// {"key","value","log_id"}.
	EventReplay
	// EventTruncated replaces the replay when the resume point is older than the
	// retained change log: {"after_log_id","oldest_log_id"}.
	EventTruncated
	// EventSnapshot is the state when the subscription started: {"state","log_id"}.
	EventSnapshot
	// EventLive is a committed change ("change" or "batch") or a relayed "run:*"
	// event. Its Payload is shared by every subscriber: do not change it.
	EventLive
)

// Event is one message of an object's feed. Name is the event's name on the wire
// ("change", "batch", "snapshot", "log_truncated", "run:..."); Payload is JSON.
type Event struct {
	Kind    EventKind
	Name    string
	Payload json.RawMessage
	// LogID is the log_id of a live "change" or "batch"; 0 for every other event.
	LogID uint64
}

// Subscriber receives an object's events. Deliver is called on the object's turn
// or on the commit pipeline's goroutine, in the feed's order; it must not block
// (queue the event, or drop the subscriber). Lost says that the object dropped
// the subscription because its activation failed (a write could not be made
// durable): the subscriber must subscribe again, resuming after the last log_id
// it saw. Neither is called again after Lost.
type Subscriber interface {
	Deliver(ev Event)
	Lost(err error)
}

// KVSubscribe subscribes Sub to the object's feed. Reply: *Subscribed. After, if
// set, asks for a replay of the change log after that log_id before the snapshot.
type KVSubscribe struct {
	Sub   Subscriber
	After *uint64
}

// Subscribed is the reply to KVSubscribe.
type Subscribed struct {
	LogID uint64 // the snapshot's log_id: live events carry later ones
	// Oldest is the oldest log_id the change log held then (LogID+1 if none):
	// with LogID, what a subscriber that pages its replay itself checks a
	// resume point against (ResumeAfter).
	Oldest uint64
}

// KVUnsubscribe removes Sub from the object's feed. Reply: nil. Removing a
// subscriber that is not subscribed does nothing.
type KVUnsubscribe struct{ Sub Subscriber }

// Publish relays an ephemeral event (Name starts with "run:") to the object's
// current subscribers, after every write before it. It is not stored and has no
// log_id. Reply: *Published.
type Publish struct {
	Name    string
	Payload json.RawMessage
}

// Published is the reply to Publish.
type Published struct {
	Subscribers int `json:"subscribers"` // subscribers the event was sent to
}

// MaxSubscribersPerObject bounds one object's subscribers.
const MaxSubscribersPerObject = 10000

// subscribers is an object's subscriber list. It is copy-on-write: a write's
// delivery callback keeps the list as it was when the write was planned.
type subscribers []Subscriber

func (s subscribers) without(sub Subscriber) subscribers {
	for i, x := range s {
		if x == sub {
			out := make(subscribers, 0, len(s)-1)
			out = append(out, s[:i]...)
			return append(out, s[i+1:]...)
		}
	}
	return s
}

func (s subscribers) contains(sub Subscriber) bool {
	for _, x := range s {
		if x == sub {
			return true
		}
	}
	return false
}

func (o *object) kvSubscribe(m KVSubscribe) (any, error) {
	if m.Sub == nil {
		return nil, badRequestf("no subscriber")
	}
	k, err := o.kvLoad()
	if err != nil {
		return nil, err
	}
	if o.subs.contains(m.Sub) {
		return nil, badRequestf("already subscribed")
	}
	if len(o.subs) >= MaxSubscribersPerObject {
		return nil, &Error{Kind: KindOverloaded, Msg: "the object has too many subscribers"}
	}
	events := []Event{{Kind: EventJoined}}
	if m.After != nil {
		replay, err := o.kvReplay(k, *m.After)
		if err != nil {
			return nil, err
		}
		events = append(events, replay...)
	}
	state := make(map[string]json.RawMessage, k.slots.len())
	k.slots.each(func(n string, v json.RawMessage) { state[n] = v })
	snap, err := json.Marshal(&KVState{State: state, LogID: k.logID})
	if err != nil {
		return nil, err
	}
	events = append(events, Event{Kind: EventSnapshot, Name: "snapshot", Payload: snap})

	o.subs = append(o.subs[:len(o.subs):len(o.subs)], m.Sub)
	o.act.subscribed.Add(1)
	sub := m.Sub
	o.gate(func() {
		for _, ev := range events {
			sub.Deliver(ev)
		}
	}, sub.Lost)
	return &Subscribed{LogID: k.logID, Oldest: k.oldest}, nil
}

// kvReplay returns the change log after `after` as replay events, or one
// log_truncated event if part of it was compacted away.
func (o *object) kvReplay(k *kvState, after uint64) ([]Event, error) {
	var events []Event
	if _, err := ResumeAfter(after, k.oldest, k.logID); err != nil {
		// A log_id above the newest was never issued by this object (it lost
		// its state): kvReadLog would not see it once a write went past it.
		return []Event{TruncatedEvent(err.(*LogTruncatedError))}, nil
	}
	for after < k.logID {
		page, err := o.kvReadLog(KVReadLog{After: after, Limit: MaxLogLimit})
		if err != nil {
			var lt *LogTruncatedError
			if errors.As(err, &lt) {
				return []Event{TruncatedEvent(lt)}, nil
			}
			return nil, err
		}
		p := page.(*LogPage)
		for _, it := range p.Items {
			b, err := json.Marshal(it)
			if err != nil {
				return nil, err
			}
			events = append(events, Event{Kind: EventReplay, Name: "change", Payload: b})
		}
		if p.Next <= after {
			break
		}
		after = p.Next
	}
	return events, nil
}

// TruncatedEvent is the log_truncated event that replaces a replay which
// cannot go on from its resume point: {"after_log_id","oldest_log_id"}.
func TruncatedEvent(lt *LogTruncatedError) Event {
	b := []byte(`{"after_log_id":` + strconv.FormatUint(lt.After, 10) + `,"oldest_log_id":` + strconv.FormatUint(lt.Oldest, 10) + `}`)
	return Event{Kind: EventTruncated, Name: "log_truncated", Payload: b}
}

func (o *object) kvUnsubscribe(m KVUnsubscribe) (any, error) {
	if o.subs.contains(m.Sub) {
		o.subs = o.subs.without(m.Sub)
		o.act.subscribed.Add(-1)
	}
	return nil, nil
}

func (o *object) publish(m Publish) (any, error) {
	if !validEventName(m.Name) {
		return nil, invalidf("event names must start with \"run:\" and be at most 64 bytes")
	}
	payload := m.Payload
	if len(payload) == 0 {
		payload = json.RawMessage(`{}`)
	}
	subs := o.subs
	if len(subs) > 0 {
		ev := Event{Kind: EventLive, Name: m.Name, Payload: payload}
		o.gate(func() { deliver(subs, ev) }, func(err error) { lose(subs, err) })
	}
	return &Published{Subscribers: len(subs)}, nil
}

func validEventName(name string) bool {
	if len(name) <= len("run:") || len(name) > 64 || name[:4] != "run:" {
		return false
	}
	for i := 0; i < len(name); i++ {
		if c := name[i]; c < 0x21 || c > 0x7E {
			return false
		}
	}
	return true
}

func deliver(subs subscribers, ev Event) {
	for _, s := range subs {
		s.Deliver(ev)
	}
}

func lose(subs subscribers, err error) {
	for _, s := range subs {
		s.Lost(err)
	}
}

// kvBroadcast hands the live event of the write just submitted (log entry id,
// changes) to the output gate for the current subscribers. batch says whether it
// is a "batch" (PATCH, transaction, purge) or a "change".
func (o *object) kvBroadcast(id uint64, changes []Change, batch bool) {
	subs := o.subs
	if len(subs) == 0 || (len(changes) == 0 && !batch) {
		return
	}
	ev := Event{Kind: EventLive, Name: "change", Payload: encodeLiveEvent(id, changes, batch), LogID: id}
	if batch {
		ev.Name = "batch"
	}
	o.gate(func() { deliver(subs, ev) }, func(err error) { lose(subs, err) })
}

// encodeLiveEvent encodes a "change" ({"key","value","previous","log_id"}) or a
// "batch" ({"changes":[{"key","value","previous"}...],"log_id"}).
func encodeLiveEvent(id uint64, changes []Change, batch bool) json.RawMessage {
	n := 40
	for _, c := range changes {
		n += len(c.Slot) + len(c.Value) + len(c.Previous) + 48
	}
	b := make([]byte, 0, n)
	item := func(c Change) {
		b = append(b, `{"key":`...)
		b = appendJSONString(b, c.Slot)
		b = append(b, `,"value":`...)
		b = appendRaw(b, c.Value)
		b = append(b, `,"previous":`...)
		b = appendRaw(b, c.Previous)
	}
	if batch {
		b = append(b, `{"changes":[`...)
		for i, c := range changes {
			if i > 0 {
				b = append(b, ',')
			}
			item(c)
			b = append(b, '}')
		}
		b = append(b, `],"log_id":`...)
	} else {
		item(changes[0])
		b = append(b, `,"log_id":`...)
	}
	b = strconv.AppendUint(b, id, 10)
	return append(b, '}')
}

func appendRaw(b []byte, v json.RawMessage) []byte {
	if v == nil {
		return append(b, "null"...)
	}
	return append(b, v...)
}
