package cluster

import (
	"bytes"
	"math"
	"strings"
	"testing"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/holdfast/holdfast/actors"
)

// The hand codec writes exactly the bytes msgpack's Encoder writes for the
// same values (so msgpack reads them, and they read msgpack's), and reads
// back what it wrote: integers at every size boundary, strings and binaries
// of every length class, arrays, nil and empty.
func TestWireCodec_IsMsgpack(t *testing.T) {
	check := func(what string, ours wbuf, theirs func(*msgpack.Encoder) error) {
		t.Helper()
		var buf bytes.Buffer
		enc := msgpack.NewEncoder(&buf)
		if err := theirs(enc); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(ours, buf.Bytes()) {
			t.Fatalf("%s: ours % x, msgpack's % x", what, ours, buf.Bytes())
		}
	}
	ints := []int64{0, 1, 127, 128, 255, 256, 65535, 65536, math.MaxUint32, math.MaxUint32 + 1, math.MaxInt64,
		-1, -32, -33, -128, -129, -32768, -32769, math.MinInt32, math.MinInt32 - 1, math.MinInt64}
	for _, v := range ints {
		check("int", wbuf(nil).int(v), func(e *msgpack.Encoder) error { return e.EncodeInt(v) })
		r := rbuf{p: wbuf(nil).int(v)}
		if got, err := r.int(); err != nil || got != v || len(r.p) != 0 {
			t.Fatalf("int %d read back as %d, %v", v, got, err)
		}
		if v >= 0 {
			u := uint64(v)
			check("uint", wbuf(nil).uint(u), func(e *msgpack.Encoder) error { return e.EncodeUint(u) })
		}
	}
	r := rbuf{p: wbuf(nil).uint(math.MaxUint64)}
	if got, err := r.uint(); err != nil || got != math.MaxUint64 {
		t.Fatalf("max uint64 read back as %d, %v", got, err)
	}
	for _, n := range []int{0, 1, 31, 32, 255, 256, 65535, 65536} {
		s := strings.Repeat("x", n)
		check("str", wbuf(nil).str(s), func(e *msgpack.Encoder) error { return e.EncodeString(s) })
		check("bin", wbuf(nil).bin([]byte(s)), func(e *msgpack.Encoder) error { return e.EncodeBytes([]byte(s)) })
		r := rbuf{p: wbuf(nil).str(s).bin([]byte(s))}
		gs, err1 := r.str()
		gb, err2 := r.bin()
		if err1 != nil || err2 != nil || gs != s || string(gb) != s || gb == nil || len(r.p) != 0 {
			t.Fatalf("str and bin of %d bytes read back as %d and %d bytes: %v %v", n, len(gs), len(gb), err1, err2)
		}
	}
	check("nil bin", wbuf(nil).bin(nil), func(e *msgpack.Encoder) error { return e.EncodeBytes(nil) })
	if b, err := (&rbuf{p: wbuf(nil).bin(nil)}).bin(); b != nil || err != nil {
		t.Fatalf("nil bin read back as %v, %v", b, err)
	}
	for _, n := range []int{0, 15, 16, 65535, 65536} {
		check("array", wbuf(nil).arrayLen(n), func(e *msgpack.Encoder) error { return e.EncodeArrayLen(n) })
	}
	check("bools", wbuf(nil).bool(true).bool(false), func(e *msgpack.Encoder) error {
		return firstErr(e.EncodeBool(true), e.EncodeBool(false))
	})
}

// Every prefix of a request and of a reply cut short fails to decode, with
// an error, never a panic or a value; bytes msgpack's reflection wrote
// inside (a handoff, a feed, an error) are read past exactly.
func TestWireCodec_ShortInputIsAnError(t *testing.T) {
	after := uint64(3)
	req := &wireRequest{Op: opObject, ID: actors.ObjectID{App: "a", Type: "t", Key: strings.Repeat("k", 40)},
		Msg:  &actors.KVWrite{Ops: []actors.Op{{Op: "set", Key: "v", Value: []byte(`"` + strings.Repeat("x", 300) + `"`)}}, Route: actors.RoutePut},
		Feed: &feedMsg{SubID: 1, After: &after}, From: "n1"}
	data, err := encodeRequest(req)
	if err != nil {
		t.Fatal(err)
	}
	for n := range len(data) {
		var w wireRequest
		if err := decodeRequest(data[:n], &w); err == nil {
			t.Fatalf("a request cut to %d of %d bytes decoded: %+v", n, len(data), w)
		}
	}
	var w wireRequest
	if err := decodeRequest(data, &w); err != nil || *w.Feed.After != 3 || w.ID.Key != req.ID.Key {
		t.Fatalf("the whole request: %+v, %v", w, err)
	}
	rd, err := encodeReplyData(&wireReply{Val: &actors.WriteResult{LogID: 1}, Err: toWireError(actors.ErrLeaseNotHeld), Served: Served{Node: "a", Partition: 3, Epoch: 9}, Unknown: []uint64{1, 2}})
	if err != nil {
		t.Fatal(err)
	}
	for n := range len(rd) {
		var r wireReply
		if err := decodeReply(rd[:n], &r); err == nil {
			t.Fatalf("a reply cut to %d of %d bytes decoded: %+v", n, len(rd), r)
		}
	}
	var r wireReply
	if err := decodeReply(rd, &r); err != nil || r.Served.Epoch != 9 || len(r.Unknown) != 2 || r.Err == nil {
		t.Fatalf("the whole reply: %+v, %v", r, err)
	}
}
