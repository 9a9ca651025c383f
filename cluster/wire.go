package cluster

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"sync"
	"time"

	"github.com/vmihailenco/msgpack/v5"
	"github.com/vmihailenco/msgpack/v5/msgpcode"

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

// wireRequest and wireReply are encoded by their EncodeMsgpack (below), not
// by msgpack's reflection: they are on every request's path.
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

// encodeValue writes v (a registered wire type's value, or a pointer to one)
// as its type's registered name, whether it was a pointer, and the value.
func encodeValue(enc *msgpack.Encoder, v any) error {
	v, ptr := wrap(v)
	if v == nil {
		return enc.EncodeNil()
	}
	t := reflect.TypeOf(v)
	wireTypes.RLock()
	name, ok := wireTypes.names[t]
	wireTypes.RUnlock()
	if !ok {
		return fmt.Errorf("%w: %s (register it with cluster.RegisterWireType)", errNotWire, t)
	}
	if err := enc.EncodeString(name); err != nil {
		return err
	}
	if err := enc.EncodeBool(ptr); err != nil {
		return err
	}
	if c, ok := fastCodecs[t]; ok {
		return c.enc(enc, v)
	}
	return enc.Encode(v)
}

// decodeValue reads what encodeValue wrote.
func decodeValue(dec *msgpack.Decoder) (any, error) {
	name, err := dec.DecodeString() // nil decodes as ""
	if err != nil || name == "" {
		return nil, err
	}
	ptr, err := dec.DecodeBool()
	if err != nil {
		return nil, err
	}
	wireTypes.RLock()
	t, ok := wireTypes.byName[name]
	wireTypes.RUnlock()
	if !ok {
		return nil, fmt.Errorf("cluster: unknown wire type %s (not registered on this node)", name)
	}
	if c, ok := fastCodecs[t]; ok {
		v, err := c.dec(dec)
		if err != nil {
			return nil, fmt.Errorf("cluster: decode %s: %w", name, err)
		}
		if ptr {
			p := reflect.New(t)
			p.Elem().Set(reflect.ValueOf(v))
			return p.Interface(), nil
		}
		return v, nil
	}
	p := reflect.New(t)
	if err := dec.DecodeValue(p.Elem()); err != nil {
		return nil, fmt.Errorf("cluster: decode %s: %w", name, err)
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

// EncodeMsgpack writes a request as an array of its fields, its message
// inline (encodeValue). By hand: msgpack's reflection over the envelope and a
// message encoded apart, then copied into it, cost about a microsecond more
// per request and again per reply (BenchmarkWire_RoundTrip256).
func (r *wireRequest) EncodeMsgpack(enc *msgpack.Encoder) error {
	return firstErr(
		enc.EncodeArrayLen(wireRequestFields),
		enc.EncodeInt(int64(r.Op)),
		enc.EncodeString(r.ID.App), enc.EncodeString(r.ID.Type), enc.EncodeString(r.ID.Key),
		enc.EncodeInt(int64(r.Wait)),
		enc.EncodeString(r.From),
		encodeValue(enc, r.Msg),
		encodeOptional(enc, r.Handoff),
		encodeOptional(enc, r.Feed),
	)
}

// encodeOptional encodes p, a pointer: a nil one without msgpack's
// reflection, which looks its type up in a sync.Map even to write nil.
func encodeOptional[T any](enc *msgpack.Encoder, p *T) error {
	if p == nil {
		return enc.EncodeNil()
	}
	return enc.Encode(p)
}

// decodeOptional decodes what encodeOptional wrote into *p.
func decodeOptional[T any](dec *msgpack.Decoder, p **T) error {
	if c, err := dec.PeekCode(); err != nil {
		return err
	} else if c == msgpcode.Nil {
		*p = nil
		return dec.Skip()
	}
	return dec.Decode(p)
}

// DecodeMsgpack reads what EncodeMsgpack wrote.
func (r *wireRequest) DecodeMsgpack(dec *msgpack.Decoder) error {
	if n, err := dec.DecodeArrayLen(); err != nil {
		return err
	} else if n != wireRequestFields {
		return fmt.Errorf("a request of %d fields, want %d", n, wireRequestFields)
	}
	op, err1 := dec.DecodeInt()
	app, err2 := dec.DecodeString()
	typ, err3 := dec.DecodeString()
	key, err4 := dec.DecodeString()
	wait, err5 := dec.DecodeInt64()
	from, err6 := dec.DecodeString()
	if err := firstErr(err1, err2, err3, err4, err5, err6); err != nil {
		return err
	}
	r.Op, r.ID, r.Wait, r.From = op, actors.ObjectID{App: app, Type: typ, Key: key}, time.Duration(wait), from
	var err error
	if r.Msg, err = decodeValue(dec); err != nil {
		return err
	}
	return firstErr(decodeOptional(dec, &r.Handoff), decodeOptional(dec, &r.Feed))
}

// EncodeMsgpack writes a reply as an array of its fields, its value inline.
func (r *wireReply) EncodeMsgpack(enc *msgpack.Encoder) error {
	return firstErr(
		enc.EncodeArrayLen(wireReplyFields),
		encodeValue(enc, r.Val),
		encodeOptional(enc, r.Err),
		enc.EncodeString(r.Served.Node), enc.EncodeUint(uint64(r.Served.Partition)), enc.EncodeUint(r.Served.Epoch),
		enc.EncodeString(r.Boot),
		encodeUints(enc, r.Unknown),
	)
}

// DecodeMsgpack reads what EncodeMsgpack wrote.
func (r *wireReply) DecodeMsgpack(dec *msgpack.Decoder) error {
	if n, err := dec.DecodeArrayLen(); err != nil {
		return err
	} else if n != wireReplyFields {
		return fmt.Errorf("a reply of %d fields, want %d", n, wireReplyFields)
	}
	var err error
	if r.Val, err = decodeValue(dec); err != nil {
		return err
	}
	if err := decodeOptional(dec, &r.Err); err != nil {
		return err
	}
	node, err1 := dec.DecodeString()
	part, err2 := dec.DecodeUint32()
	epoch, err3 := dec.DecodeUint64()
	boot, err4 := dec.DecodeString()
	if err := firstErr(err1, err2, err3, err4); err != nil {
		return err
	}
	r.Served, r.Boot = Served{Node: node, Partition: part, Epoch: epoch}, boot
	r.Unknown, err = decodeUints(dec)
	return err
}

// encodeUints writes a slice of ids (nil as nil).
func encodeUints(enc *msgpack.Encoder, ids []uint64) error {
	if ids == nil {
		return enc.EncodeNil()
	}
	if err := enc.EncodeArrayLen(len(ids)); err != nil {
		return err
	}
	for _, id := range ids {
		if err := enc.EncodeUint(id); err != nil {
			return err
		}
	}
	return nil
}

// decodeUints reads what encodeUints wrote.
func decodeUints(dec *msgpack.Decoder) ([]uint64, error) {
	n, err := dec.DecodeArrayLen() // -1: nil
	if err != nil || n < 0 {
		return nil, err
	}
	ids := make([]uint64, n)
	for i := range ids {
		if ids[i], err = dec.DecodeUint64(); err != nil {
			return nil, err
		}
	}
	return ids, nil
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

// wireBufs are the buffers marshal encodes into. msgpack.Marshal starts each
// value in a new bytes.Buffer that grows by doubling: in the forward
// benchmark (bench -cluster, other-64) that growth, its clearing and copying
// were 8% of the CPU. A reused buffer keeps its capacity.
var wireBufs = sync.Pool{New: func() any { return new(bytes.Buffer) }}

// maxPooledWireBuf bounds a buffer kept for reuse (handoff chunks are larger
// and rare).
const maxPooledWireBuf = 256 << 10

// marshal is msgpack.Marshal into a reused buffer; the result is its own copy.
func marshal(v any) ([]byte, error) {
	buf := wireBufs.Get().(*bytes.Buffer)
	buf.Reset()
	enc := msgpack.GetEncoder()
	enc.Reset(buf)
	enc.UseArrayEncodedStructs(true)
	err := enc.Encode(v)
	msgpack.PutEncoder(enc)
	var out []byte
	if err == nil {
		out = bytes.Clone(buf.Bytes())
	}
	if buf.Cap() <= maxPooledWireBuf {
		wireBufs.Put(buf)
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
func encodeRequest(req *wireRequest) ([]byte, error) { return marshal(req) }

// decodeRequest decodes a request, its message included.
func decodeRequest(data []byte, req *wireRequest) error {
	if err := msgpack.Unmarshal(data, req); err != nil {
		return fmt.Errorf("cluster: decode a request: %w", err)
	}
	return nil
}

// encodeReplyData encodes a reply, its value included.
func encodeReplyData(reply *wireReply) ([]byte, error) { return marshal(reply) }

// decodeReply decodes a reply, its value included.
func decodeReply(data []byte, reply *wireReply) error {
	if err := msgpack.Unmarshal(data, reply); err != nil {
		return fmt.Errorf("cluster: decode a reply: %w", err)
	}
	return nil
}
