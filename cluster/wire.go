package cluster

import (
	"bytes"
	"encoding/gob"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"time"

	"github.com/holdfast/holdfast/actors"
)

// What travels between nodes. The envelope is protoactor-go's protobuf
// GrainRequest/GrainResponse; its bytes are a gob of wireRequest/wireReply, so
// that every message type of the actors package crosses as it is, with no
// second schema to keep in step. A user-defined object type's messages and
// replies cross too once registered with RegisterWireType.

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
)

type wireRequest struct {
	Op   int
	ID   actors.ObjectID
	Msg  any
	Ptr  bool          // Msg was a pointer (gob sends what it points at)
	Wait time.Duration // how long the caller waits for the reply
	From string        // the sending node

	Handoff *handoffMsg
	Feed    *feedMsg
}

type wireReply struct {
	Val    any
	Ptr    bool
	Err    *wireError
	Served Served
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
		return &wireError{NotOwner: true, Kind: actors.KindUnavailable, Msg: no.Error(), RetryAfter: 100 * time.Millisecond}
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
		return &notOwnerError{msg: w.Msg}
	}
	return &actors.Error{Kind: w.Kind, Msg: w.Msg, RetryAfter: w.RetryAfter, Code: w.Code}
}

// notOwnerError says that a node asked to serve an object does not serve its
// partition (any more, or yet): the caller looks again where it lives.
type notOwnerError struct{ msg string }

func (e *notOwnerError) Error() string { return e.msg }

// RegisterWireType lets values of v's type cross between nodes as messages or
// replies of a user-defined object type (encoding/gob, exported fields only).
// Call it at start-up, on every node, before the first request.
func RegisterWireType(v any) {
	t := reflect.TypeOf(v)
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	gob.Register(reflect.Zero(t).Interface())
}

func init() {
	for _, v := range []any{
		json.RawMessage(nil), map[string]any(nil), []any(nil), map[string]json.RawMessage(nil),
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

// wrap returns v as gob carries it (pointers followed) and whether it was a
// pointer; unwrap turns it back.
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

func unwrap(v any, ptr bool) any {
	if v == nil {
		return nil
	}
	rv := reflect.ValueOf(v)
	if ptr && rv.Kind() != reflect.Pointer {
		p := reflect.New(rv.Type())
		p.Elem().Set(rv)
		return p.Interface()
	}
	if !ptr && rv.Kind() == reflect.Pointer {
		return rv.Elem().Interface()
	}
	return v
}

func encodeGob(v any) ([]byte, error) {
	var b bytes.Buffer
	if err := gob.NewEncoder(&b).Encode(v); err != nil {
		return nil, fmt.Errorf("cluster: encode %T: %w", v, err)
	}
	return b.Bytes(), nil
}

func decodeGob(data []byte, v any) error {
	if err := gob.NewDecoder(bytes.NewReader(data)).Decode(v); err != nil {
		return fmt.Errorf("cluster: decode: %w", err)
	}
	return nil
}
