package cluster

import (
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/holdfast/holdfast/actors"
	"github.com/holdfast/holdfast/persistence"
)

// Every message and reply crosses as it is: fields without JSON (json:"-")
// included, pointers as pointers, values as values, errors with what callers
// match on.
func TestWire_RoundTrips(t *testing.T) {
	after := uint64(7)
	for _, v := range []any{
		&actors.KVWrite{Ops: []actors.Op{{Op: "set", Key: "s", Value: json.RawMessage(`{"a":1}`)}}, Route: actors.RoutePut, IdempotencyKey: "k"},
		actors.KVGet{},
		&actors.WriteResult{LogID: 9, Value: json.RawMessage(`3`), Changes: []actors.Change{{Slot: "s", Value: json.RawMessage(`1`)}}},
		&actors.LogPage{Items: []actors.LogItem{{Key: "k", Value: json.RawMessage(`1`), LogID: 2}}, Next: 2},
		actors.QueueReceive{Target: "t", Max: 3, Visibility: 2 * time.Second},
		&actors.KVState{State: map[string]json.RawMessage{"a": json.RawMessage(`1`)}, LogID: 4},
		json.RawMessage(`"slot value"`),
		actors.LogAppend{Records: []actors.LogInput{{Body: json.RawMessage(`1`)}}},
	} {
		name, data, ptr, err := packValue(v)
		if err != nil {
			t.Fatalf("%T: %v", v, err)
		}
		got, err := unpackValue(name, data, ptr)
		if err != nil {
			t.Fatalf("%T: %v", v, err)
		}
		if !reflect.DeepEqual(got, v) {
			t.Fatalf("%T: got %#v, want %#v", v, got, v)
		}
	}
	// A whole request and reply, with the handoff and feed parts.
	req := &wireRequest{Op: opObject, ID: actors.ObjectID{App: "a", Type: "t", Key: "k"}, Msg: &actors.KVWrite{Route: "put"}, From: "n1",
		Handoff: &handoffMsg{Partition: 3, MoveID: "m", Changes: []persistence.Change{{Key: []byte("k"), Value: []byte("v")}, {Key: []byte("d"), Deleted: true}}},
		Feed:    &feedMsg{SubID: 2, After: &after, Events: []actors.Event{{Kind: actors.EventLive, Name: "change", Payload: json.RawMessage(`{}`)}}}}
	data, err := encodeRequest(req)
	if err != nil {
		t.Fatal(err)
	}
	var back wireRequest
	if err := decodeRequest(data, &back); err != nil {
		t.Fatal(err)
	}
	if back.Msg.(*actors.KVWrite).Route != "put" || back.Handoff.Changes[1].Deleted != true || *back.Feed.After != 7 || back.Feed.Events[0].Name != "change" {
		t.Fatalf("request back: %+v", back)
	}
	for _, e := range []error{
		&actors.LogTruncatedError{After: 1, Oldest: 5},
		&actors.OffsetTruncatedError{Requested: 1, Oldest: 5},
		actors.ErrLeaseNotHeld,
		&actors.Error{Kind: actors.KindOverloaded, Msg: "busy", RetryAfter: time.Second},
	} {
		rd, err := encodeReplyData(&wireReply{Err: toWireError(e)})
		if err != nil {
			t.Fatal(err)
		}
		var r wireReply
		if err := decodeReply(rd, &r); err != nil {
			t.Fatal(err)
		}
		got := r.Err.err()
		if !errors.Is(got, e) && !reflect.DeepEqual(got, e) {
			t.Fatalf("error %v came back as %v", e, got)
		}
	}
	// An unregistered type is refused, not sent.
	type private struct{ A int }
	if _, err := encodeRequest(&wireRequest{Msg: private{}}); !errors.Is(err, errNotWire) {
		t.Fatalf("unregistered type: %v", err)
	}
}

func BenchmarkWire_RoundTrip(b *testing.B) {
	benchWireRoundTrip(b, []byte(`"hello world"`))
}

// BenchmarkWire_RoundTrip256 is a set of 256 bytes, as bench -cluster's.
func BenchmarkWire_RoundTrip256(b *testing.B) {
	benchWireRoundTrip(b, []byte(`"`+strings.Repeat("x", 254)+`"`))
}

func benchWireRoundTrip(b *testing.B, value []byte) {
	msg := &actors.KVWrite{Ops: []actors.Op{{Op: "set", Key: "v", Value: value}}, Route: actors.RoutePut}
	b.ReportAllocs()
	for b.Loop() {
		data, _ := encodeRequest(&wireRequest{Op: opObject, ID: actors.ObjectID{App: "a", Type: "t", Key: "k"}, Msg: msg})
		var w wireRequest
		_ = decodeRequest(data, &w)
		rd, _ := encodeReplyData(&wireReply{Val: &actors.WriteResult{LogID: 5}})
		var r wireReply
		_ = decodeReply(rd, &r)
	}
}
