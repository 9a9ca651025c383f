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

	"github.com/holdfast/holdfast/actors"
)

// What travels between nodes. The envelope is protoactor-go's protobuf
// GrainRequest/GrainResponse; its bytes are a MessagePack of
// wireRequest/wireReply, whose message and reply are MessagePack of the actors
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
)

type wireRequest struct {
	Op      int
	ID      actors.ObjectID
	Msg     any           `msgpack:"-"`
	MsgType string        // Msg's registered type name
	MsgData []byte        // Msg, encoded
	Ptr     bool          // Msg was a pointer
	Wait    time.Duration // how long the caller waits for the reply
	From    string        // the sending node
	Call    uint64        // the caller's id of this request (random; 0: none)
	Ask     uint64        // opPing: the Call the caller still waits for

	Handoff *handoffMsg
	Feed    *feedMsg
}

type wireReply struct {
	Val     any `msgpack:"-"`
	ValType string
	ValData []byte
	Ptr     bool
	Err     *wireError
	Served  Served
	Boot    string   // opPing: the answering node's run
	Tracks  bool     // opPing: the node says whether it is running Ask (Busy)
	Busy    bool     // opPing: Ask arrived and its reply has not been sent yet
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

// packValue encodes v (pointers followed) with its type's registered name.
func packValue(v any) (name string, data []byte, ptr bool, err error) {
	v, ptr = wrap(v)
	if v == nil {
		return "", nil, ptr, nil
	}
	t := reflect.TypeOf(v)
	wireTypes.RLock()
	name, ok := wireTypes.names[t]
	wireTypes.RUnlock()
	if !ok {
		return "", nil, false, fmt.Errorf("%w: %s (register it with cluster.RegisterWireType)", errNotWire, t)
	}
	data, err = marshal(v)
	return name, data, ptr, err
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

// unpackValue decodes what packValue encoded.
func unpackValue(name string, data []byte, ptr bool) (any, error) {
	if name == "" {
		return nil, nil
	}
	wireTypes.RLock()
	t, ok := wireTypes.byName[name]
	wireTypes.RUnlock()
	if !ok {
		return nil, fmt.Errorf("cluster: unknown wire type %s (not registered on this node)", name)
	}
	p := reflect.New(t)
	if err := msgpack.Unmarshal(data, p.Interface()); err != nil {
		return nil, fmt.Errorf("cluster: decode %s: %w", name, err)
	}
	if ptr {
		return p.Interface(), nil
	}
	return p.Elem().Interface(), nil
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
	if req.Msg != nil {
		var err error
		if req.MsgType, req.MsgData, req.Ptr, err = packValue(req.Msg); err != nil {
			return nil, err
		}
	}
	return marshal(req)
}

// decodeRequest decodes a request, its message included.
func decodeRequest(data []byte, req *wireRequest) error {
	if err := msgpack.Unmarshal(data, req); err != nil {
		return fmt.Errorf("cluster: decode a request: %w", err)
	}
	var err error
	req.Msg, err = unpackValue(req.MsgType, req.MsgData, req.Ptr)
	return err
}

// encodeReplyData encodes a reply, its value included.
func encodeReplyData(reply *wireReply) ([]byte, error) {
	if reply.Val != nil {
		var err error
		if reply.ValType, reply.ValData, reply.Ptr, err = packValue(reply.Val); err != nil {
			return nil, err
		}
	}
	return marshal(reply)
}

// decodeReply decodes a reply, its value included.
func decodeReply(data []byte, reply *wireReply) error {
	if err := msgpack.Unmarshal(data, reply); err != nil {
		return fmt.Errorf("cluster: decode a reply: %w", err)
	}
	var err error
	reply.Val, err = unpackValue(reply.ValType, reply.ValData, reply.Ptr)
	return err
}
