package cluster

import (
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"sync"
	"time"

	"github.com/holdfast/holdfast/actors"
)

// What travels between nodes. A frame's payload (remote.go) is a MessagePack
// of wireRequest/wireReply, whose message and reply are MessagePack of the actors
// package's own types, named by a registry: every exported field crosses as it
// is (JSON tags play no part), with no second schema to keep in step. A
// user-defined object type's messages and replies cross too once registered
// with RegisterWireType. (encoding/gob did the same at 143 µs and 913
// allocations per round trip, since each message carried its type
// descriptions; MessagePack needs a few µs.)

// request kinds
const (
	opObject       = iota + 1 // a message for an object
	opHandoffBegin            // a partition's keyspace is about to arrive
	opHandoffChunk            // part of it
	opHandoffEnd              // the handoff finished (Commit) or was given up
	opSubscribe               // subscribe a remote socket to an object's feed
	opUnsubscribe             // end a remote subscription
	opFeed                    // events of a remote subscription (owner to subscriber node)
	opPing                    // are you there?
	opSubsCheck               // which of these remote subscriptions does the owner still hold?
	opList                    // list a type's keys in some partitions (list.go)
)

// wireRequest and wireReply are encoded by hand (appendRequest and
// appendReply, below, on wirecodec.go's byte slices), not by msgpack's
// reflection: they are on every request's path.
type wireRequest struct {
	Op   int
	ID   actors.ObjectID
	Msg  any           // a registered wire type's value, or a pointer to one
	Wait time.Duration // how long the caller waits for the reply
	From string        // the sending node

	Handoff *handoffMsg
	Feed    *feedMsg
}

type wireReply struct {
	Val     any // a registered wire type's value, or a pointer to one
	Err     *wireError
	Served  Served
	Boot    string   // opPing: the answering node's run
	Unknown []uint64 // opSubsCheck: the subscriptions the owner does not hold
}

// wireError carries an error across nodes with everything callers match on.
type wireError struct {
	Kind       actors.Kind
	Msg        string
	RetryAfter time.Duration
	Code       string
	LogTrunc   *actors.LogTruncatedError
	OffTrunc   *actors.OffsetTruncatedError
	NotOwner   bool // the receiver does not serve the object's partition now
	// Leader is, with NotOwner, the node the receiver believes leads the
	// partition (replicated clusters; "" unknown).
	Leader string
}

func toWireError(err error) *wireError {
	if err == nil {
		return nil
	}
	var lt *actors.LogTruncatedError
	if errors.As(err, &lt) {
		return &wireError{LogTrunc: lt}
	}
	var ot *actors.OffsetTruncatedError
	if errors.As(err, &ot) {
		return &wireError{OffTrunc: ot}
	}
	var no *notOwnerError
	if errors.As(err, &no) {
		return &wireError{NotOwner: true, Kind: actors.KindUnavailable, Msg: no.Error(), RetryAfter: 100 * time.Millisecond, Leader: no.leader}
	}
	var e *actors.Error
	if errors.As(err, &e) {
		return &wireError{Kind: e.Kind, Msg: e.Msg, RetryAfter: e.RetryAfter, Code: e.Code}
	}
	return &wireError{Kind: actors.KindInternal, Msg: "internal error"}
}

func (w *wireError) err() error {
	switch {
	case w == nil:
		return nil
	case w.LogTrunc != nil:
		return w.LogTrunc
	case w.OffTrunc != nil:
		return w.OffTrunc
	case w.NotOwner:
		return &notOwnerError{msg: w.Msg, leader: w.Leader}
	}
	return &actors.Error{Kind: w.Kind, Msg: w.Msg, RetryAfter: w.RetryAfter, Code: w.Code}
}

// notOwnerError says that a node asked to serve an object does not serve its
// partition (any more, or yet): the caller looks again where it lives.
// In a replicated cluster it names the node the refusing replica believes
// leads the partition.
type notOwnerError struct{ msg, leader string }

func (e *notOwnerError) Error() string { return e.msg }

// RegisterWireType lets values of v's type cross between nodes as messages or
// replies of a user-defined object type (MessagePack, exported fields). Call it
// at start-up, on every node, before the first request.
func RegisterWireType(v any) {
	t := reflect.TypeOf(v)
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	wireTypes.Lock()
	defer wireTypes.Unlock()
	name := t.String()
	if prev, ok := wireTypes.byName[name]; ok && prev != t {
		panic(fmt.Sprintf("cluster: two wire types named %s", name))
	}
	wireTypes.byName[name] = t
	wireTypes.names[t] = name
}

// wireTypes is the registry of the types that cross between nodes.
var wireTypes = struct {
	sync.RWMutex
	byName map[string]reflect.Type
	names  map[reflect.Type]string
}{byName: map[string]reflect.Type{}, names: map[reflect.Type]string{}}

// errNotWire is a value whose type is not registered to cross between nodes.
var errNotWire = errors.New("cluster: this type cannot cross between nodes")

// encodeValue appends v (a registered wire type's value, or a pointer to
// one) as its type's registered name, whether it was a pointer, and the
// value: by its fast codec (wirefast.go), else by msgpack's reflection.
func (b wbuf) value(v any) (wbuf, error) {
	v, ptr := wrap(v)
	if v == nil {
		return b.nil(), nil
	}
	t := reflect.TypeOf(v)
	wireTypes.RLock()
	name, ok := wireTypes.names[t]
	wireTypes.RUnlock()
	if !ok {
		return b, fmt.Errorf("%w: %s (register it with cluster.RegisterWireType)", errNotWire, t)
	}
	b = b.str(name).bool(ptr)
	if c, ok := fastCodecs[t]; ok {
		return c.enc(b, v), nil
	}
	return b.msgpack(v)
}

// value reads what wbuf.value wrote.
func (r *rbuf) value() (any, error) {
	nb, err := r.strBytes() // nil reads as nil: no value
	if err != nil || len(nb) == 0 {
		return nil, err
	}
	ptr, err := r.bool()
	if err != nil {
		return nil, err
	}
	wireTypes.RLock()
	t, ok := wireTypes.byName[string(nb)]
	wireTypes.RUnlock()
	if !ok {
		return nil, fmt.Errorf("cluster: unknown wire type %s (not registered on this node)", nb)
	}
	if c, ok := fastCodecs[t]; ok {
		v, err := c.dec(r)
		if err != nil {
			return nil, fmt.Errorf("cluster: decode %s: %w", nb, err)
		}
		if ptr {
			p := reflect.New(t)
			p.Elem().Set(reflect.ValueOf(v))
			return p.Interface(), nil
		}
		return v, nil
	}
	p := reflect.New(t)
	if err := r.msgpack(p.Interface()); err != nil {
		return nil, fmt.Errorf("cluster: decode %s: %w", nb, err)
	}
	if ptr {
		return p.Interface(), nil
	}
	return p.Elem().Interface(), nil
}

// The envelopes' fields in order; a decoder refuses another count.
const (
	wireRequestFields = 9
	wireReplyFields   = 7
)

// appendRequest appends a request as an array of its fields, its message
// inline (wbuf.value).
func appendRequest(b wbuf, r *wireRequest) (wbuf, error) {
	b = b.arrayLen(wireRequestFields).int(int64(r.Op)).str(r.ID.App).str(r.ID.Type).str(r.ID.Key).int(int64(r.Wait)).str(r.From)
	b, err := b.value(r.Msg)
	if err != nil {
		return b, err
	}
	if b, err = optional(b, r.Handoff); err != nil {
		return b, err
	}
	return optional(b, r.Feed)
}

// optional appends p, a pointer, by msgpack's reflection; a nil one as nil.
func optional[T any](b wbuf, p *T) (wbuf, error) {
	if p == nil {
		return b.nil(), nil
	}
	return b.msgpack(p)
}

// readOptional reads what optional wrote into *p.
func readOptional[T any](r *rbuf, p **T) error {
	if r.isNil() {
		*p = nil
		return nil
	}
	return r.msgpack(p)
}

// readRequest reads what appendRequest wrote.
func readRequest(r *rbuf, w *wireRequest) error {
	if err := r.fields(wireRequestFields, "request"); err != nil {
		return err
	}
	op, err1 := r.int()
	app, err2 := r.str()
	typ, err3 := r.str()
	key, err4 := r.str()
	wait, err5 := r.int()
	from, err6 := r.str()
	if err := firstErr(err1, err2, err3, err4, err5, err6); err != nil {
		return err
	}
	w.Op, w.ID, w.Wait, w.From = int(op), actors.ObjectID{App: app, Type: typ, Key: key}, time.Duration(wait), from
	var err error
	if w.Msg, err = r.value(); err != nil {
		return err
	}
	return firstErr(readOptional(r, &w.Handoff), readOptional(r, &w.Feed))
}

// appendReply appends a reply as an array of its fields, its value inline.
func appendReply(b wbuf, r *wireReply) (wbuf, error) {
	b = b.arrayLen(wireReplyFields)
	b, err := b.value(r.Val)
	if err != nil {
		return b, err
	}
	if b, err = optional(b, r.Err); err != nil {
		return b, err
	}
	b = b.str(r.Served.Node).uint(uint64(r.Served.Partition)).uint(r.Served.Epoch).str(r.Boot)
	if r.Unknown == nil {
		return b.nil(), nil
	}
	b = b.arrayLen(len(r.Unknown))
	for _, id := range r.Unknown {
		b = b.uint(id)
	}
	return b, nil
}

// readReply reads what appendReply wrote.
func readReply(r *rbuf, w *wireReply) error {
	if err := r.fields(wireReplyFields, "reply"); err != nil {
		return err
	}
	var err error
	if w.Val, err = r.value(); err != nil {
		return err
	}
	if err := readOptional(r, &w.Err); err != nil {
		return err
	}
	node, err1 := r.str()
	part, err2 := r.uint()
	epoch, err3 := r.uint()
	boot, err4 := r.str()
	if err := firstErr(err1, err2, err3, err4); err != nil {
		return err
	}
	w.Served, w.Boot = Served{Node: node, Partition: uint32(part), Epoch: epoch}, boot
	n, err := r.arrayLen()
	if err != nil || n < 0 {
		return err
	}
	w.Unknown = make([]uint64, n)
	for i := range w.Unknown {
		if w.Unknown[i], err = r.uint(); err != nil {
			return err
		}
	}
	return nil
}

// firstErr returns the first error of errs that is not nil. (Every encoder
// call runs; after a failed one the output is dropped anyway.)
func firstErr(errs ...error) error {
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// wireBufs are the buffers frames are encoded into. Growing a new slice by
// doubling for each one, then clearing and copying it, was 8% of the CPU in
// the forward benchmark (bench -cluster, other-64); a reused buffer keeps its
// capacity, and the frame is one copy of it.
var wireBufs = sync.Pool{New: func() any { return new(wbuf) }}

// maxPooledWireBuf bounds a buffer kept for reuse (handoff chunks are larger
// and rare).
const maxPooledWireBuf = 256 << 10

// encodeWith encodes with f into a reused buffer; the result is its own copy.
func encodeWith(f func(wbuf) (wbuf, error)) ([]byte, error) {
	bp := wireBufs.Get().(*wbuf)
	b, err := f((*bp)[:0])
	var out []byte
	if err == nil {
		out = append(make([]byte, 0, len(b)), b...)
	}
	if cap(b) <= maxPooledWireBuf {
		*bp = b
		wireBufs.Put(bp)
	}
	return out, err
}

func init() {
	for _, v := range []any{
		json.RawMessage(nil),
		actors.KVGet{}, actors.KVGetSlot{}, actors.KVWrite{}, actors.KVReadLog{}, actors.KVState{},
		actors.WriteResult{}, actors.LogPage{}, actors.Publish{}, actors.Published{}, actors.Subscribed{},
		actors.LogAppend{}, actors.LogAppended{}, actors.LogRead{}, actors.RecordPage{},
		actors.LogBoundsGet{}, actors.LogBounds{}, actors.LogCommit{}, actors.LogCursorGet{},
		actors.LogCursor{}, actors.LogCursorsGet{}, actors.LogCursors{}, actors.LogLoadGet{},
		actors.LogLoad{}, actors.LogTrim{}, actors.LogForgetCold{}, actors.LogForgotten{},
		actors.LogTrimmed{}, actors.LogLease{}, actors.Lease{}, actors.LogAck{}, actors.AckResult{},
		actors.LogNack{}, actors.LogLeasesGet{}, actors.LeaseList{}, actors.LogDeadLettersGet{},
		actors.DeadLetters{},
		actors.AlarmSet{}, actors.AlarmScheduled{}, actors.AlarmGet{}, actors.AlarmDelete{},
		actors.AlarmListGet{}, actors.AlarmList{}, actors.AlarmInfo{},
		actors.QueueEnqueue{}, actors.QueueEnqueued{}, actors.QueueReceive{}, actors.QueueReceived{},
		actors.QueueAck{}, actors.QueueAcked{}, actors.QueueNack{}, actors.QueueDead{},
		actors.QueueSettled{}, actors.QueueMessageGet{}, actors.QueueMessage{}, actors.QueueStatsGet{},
		actors.QueueStats{}, actors.QueueDeadLettersGet{}, actors.QueueDeadLetters{},
		actors.QueueRedrive{}, actors.QueueRedriven{}, actors.QueueDeadLetterDelete{},
		actors.QueueReplay{}, actors.ReplaySummary{},
	} {
		RegisterWireType(v)
	}
}

// wrap returns what v points at (v itself if it is not a pointer) and whether
// it was a pointer.
func wrap(v any) (any, bool) {
	rv := reflect.ValueOf(v)
	if !rv.IsValid() || rv.Kind() != reflect.Pointer {
		return v, false
	}
	if rv.IsNil() {
		return nil, false
	}
	return rv.Elem().Interface(), true
}

// encodeRequest encodes a request, its message included.
func encodeRequest(req *wireRequest) ([]byte, error) {
	return encodeWith(func(b wbuf) (wbuf, error) { return appendRequest(b, req) })
}

// decodeRequest decodes a request, its message included.
func decodeRequest(data []byte, req *wireRequest) error {
	r := rbuf{p: data}
	if err := readRequest(&r, req); err != nil {
		return fmt.Errorf("cluster: decode a request: %w", err)
	}
	return nil
}

// encodeReplyData encodes a reply, its value included.
func encodeReplyData(reply *wireReply) ([]byte, error) {
	return encodeWith(func(b wbuf) (wbuf, error) { return appendReply(b, reply) })
}

// decodeReply decodes a reply, its value included.
func decodeReply(data []byte, reply *wireReply) error {
	r := rbuf{p: data}
	if err := readReply(&r, reply); err != nil {
		return fmt.Errorf("cluster: decode a reply: %w", err)
	}
	return nil
}
