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
		data, err := encodeReplyData(&wireReply{Val: v})
		if err != nil {
			t.Fatalf("%T: %v", v, err)
		}
		var r wireReply
		if err := decodeReply(data, &r); err != nil {
			t.Fatalf("%T: %v", v, err)
		}
		if got := r.Val; !reflect.DeepEqual(got, v) {
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

// fill sets every exported field of the value v points at, recursively, to
// something other than its zero value (slices get two elements).
func fill(v reflect.Value) {
	switch v.Kind() {
	case reflect.Pointer:
		if v.IsNil() {
			v.Set(reflect.New(v.Type().Elem()))
		}
		fill(v.Elem())
	case reflect.Struct:
		for i := range v.NumField() {
			if v.Type().Field(i).IsExported() {
				fill(v.Field(i))
			}
		}
	case reflect.Slice:
		if v.Type().Elem().Kind() == reflect.Uint8 { // []byte, json.RawMessage
			v.SetBytes([]byte(`"` + v.Type().String() + `"`))
			return
		}
		v.Set(reflect.MakeSlice(v.Type(), 2, 2))
		for i := range 2 {
			fill(v.Index(i))
		}
	case reflect.String:
		v.SetString("s-" + v.Type().String())
	case reflect.Bool:
		v.SetBool(true)
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		v.SetInt(7)
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		v.SetUint(9)
	default:
		panic("fill: add " + v.Kind().String())
	}
}

// The hand-written codecs (wirefast.go) carry every exported field of their
// types: a field added to one of them and not to its codec fails here. Nil
// and empty byte slices and a nil Changes come back as they went.
func TestWire_FastCodecsCoverEveryField(t *testing.T) {
	for typ := range fastCodecs {
		p := reflect.New(typ)
		fill(p)
		for _, v := range []any{p.Interface(), p.Elem().Interface()} {
			data, err := encodeReplyData(&wireReply{Val: v})
			if err != nil {
				t.Fatalf("%s: %v", typ, err)
			}
			var r wireReply
			if err := decodeReply(data, &r); err != nil {
				t.Fatalf("%s: %v", typ, err)
			}
			if !reflect.DeepEqual(r.Val, v) {
				t.Fatalf("%s: got %#v, want %#v", typ, r.Val, v)
			}
		}
	}
	for _, v := range []any{
		actors.WriteResult{LogID: 1},
		actors.WriteResult{Changes: []actors.Change{}, Value: json.RawMessage{}},
		actors.KVWrite{Ops: []actors.Op{{Op: "delete", Key: "k"}}},
		actors.KVWrite{Purge: true},
	} {
		data, err := encodeReplyData(&wireReply{Val: v})
		if err != nil {
			t.Fatal(err)
		}
		var r wireReply
		if err := decodeReply(data, &r); err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(r.Val, v) {
			t.Fatalf("got %#v, want %#v", r.Val, v)
		}
	}
}
