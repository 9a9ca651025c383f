package cluster

import (
	"encoding/json"
	"fmt"
	"reflect"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/holdfast/holdfast/actors"
)

// Codecs by hand for the messages on the hot path between members: a KV write
// and its reply. msgpack's reflection looks each struct's fields up in a
// sync.Map and decodes them through reflect.Value; for a 256-byte set and its
// reply that was about 2 µs per request, on both members, a tenth of a node's
// CPU per forwarded write (BenchmarkWire_RoundTrip256; the profile of bench
// -case holdfast-client/increments-256). Every other type crosses by
// reflection. TestWire_FastCodecsCoverEveryField fails when one of these types
// gains a field the codec does not carry.

// fastCodec encodes and decodes the value of one type (not a pointer to it).
type fastCodec struct {
	enc func(*msgpack.Encoder, any) error
	dec func(*msgpack.Decoder) (any, error)
}

var fastCodecs = map[reflect.Type]fastCodec{
	reflect.TypeFor[actors.KVWrite]():     {encKVWrite, decKVWrite},
	reflect.TypeFor[actors.WriteResult](): {encWriteResult, decWriteResult},
}

const (
	kvWriteFields     = 5
	opFields          = 4
	writeResultFields = 3
	changeFields      = 3
)

func encKVWrite(enc *msgpack.Encoder, v any) error {
	w := v.(actors.KVWrite)
	if err := firstErr(enc.EncodeArrayLen(kvWriteFields), enc.EncodeArrayLen(len(w.Ops))); err != nil {
		return err
	}
	for i := range w.Ops {
		o := &w.Ops[i]
		if err := firstErr(enc.EncodeArrayLen(opFields), enc.EncodeString(o.Op), enc.EncodeString(o.Key),
			enc.EncodeBytes(o.Value), enc.EncodeBytes(o.By)); err != nil {
			return err
		}
	}
	return firstErr(enc.EncodeBool(w.Transaction), enc.EncodeBool(w.Purge), enc.EncodeString(w.IdempotencyKey), enc.EncodeString(w.Route))
}

func decKVWrite(dec *msgpack.Decoder) (any, error) {
	var w actors.KVWrite
	if err := decArrayLen(dec, kvWriteFields, "KVWrite"); err != nil {
		return nil, err
	}
	n, err := dec.DecodeArrayLen()
	if err != nil {
		return nil, err
	}
	if n > 0 {
		w.Ops = make([]actors.Op, n)
	}
	for i := range w.Ops {
		o := &w.Ops[i]
		if err := decArrayLen(dec, opFields, "Op"); err != nil {
			return nil, err
		}
		var err1, err2, err3, err4 error
		o.Op, err1 = dec.DecodeString()
		o.Key, err2 = dec.DecodeString()
		o.Value, err3 = decRaw(dec)
		o.By, err4 = decRaw(dec)
		if err := firstErr(err1, err2, err3, err4); err != nil {
			return nil, err
		}
	}
	var err1, err2, err3, err4 error
	w.Transaction, err1 = dec.DecodeBool()
	w.Purge, err2 = dec.DecodeBool()
	w.IdempotencyKey, err3 = dec.DecodeString()
	w.Route, err4 = dec.DecodeString()
	return w, firstErr(err1, err2, err3, err4)
}

func encWriteResult(enc *msgpack.Encoder, v any) error {
	r := v.(actors.WriteResult)
	if err := firstErr(enc.EncodeArrayLen(writeResultFields), enc.EncodeUint(r.LogID), enc.EncodeBytes(r.Value)); err != nil {
		return err
	}
	if r.Changes == nil {
		return enc.EncodeNil()
	}
	if err := enc.EncodeArrayLen(len(r.Changes)); err != nil {
		return err
	}
	for i := range r.Changes {
		c := &r.Changes[i]
		if err := firstErr(enc.EncodeArrayLen(changeFields), enc.EncodeString(c.Slot), enc.EncodeBytes(c.Value), enc.EncodeBytes(c.Previous)); err != nil {
			return err
		}
	}
	return nil
}

func decWriteResult(dec *msgpack.Decoder) (any, error) {
	var r actors.WriteResult
	if err := decArrayLen(dec, writeResultFields, "WriteResult"); err != nil {
		return nil, err
	}
	var err1, err2 error
	r.LogID, err1 = dec.DecodeUint64()
	r.Value, err2 = decRaw(dec)
	if err := firstErr(err1, err2); err != nil {
		return nil, err
	}
	n, err := dec.DecodeArrayLen() // -1: nil
	if err != nil {
		return nil, err
	}
	if n >= 0 {
		r.Changes = make([]actors.Change, n)
	}
	for i := range r.Changes {
		c := &r.Changes[i]
		if err := decArrayLen(dec, changeFields, "Change"); err != nil {
			return nil, err
		}
		var err1, err2, err3 error
		c.Slot, err1 = dec.DecodeString()
		c.Value, err2 = decRaw(dec)
		c.Previous, err3 = decRaw(dec)
		if err := firstErr(err1, err2, err3); err != nil {
			return nil, err
		}
	}
	return r, nil
}

// decArrayLen reads an array header of want elements (a struct of want
// fields).
func decArrayLen(dec *msgpack.Decoder, want int, what string) error {
	n, err := dec.DecodeArrayLen()
	if err != nil {
		return err
	}
	if n != want {
		return fmt.Errorf("cluster: a %s of %d fields, want %d", what, n, want)
	}
	return nil
}

// decRaw reads bytes written by EncodeBytes: nil stays nil, empty stays
// empty (a JSON value is never empty, but the codec does not decide that).
func decRaw(dec *msgpack.Decoder) (json.RawMessage, error) {
	b, err := dec.DecodeBytes()
	if b == nil || err != nil {
		return nil, err
	}
	return json.RawMessage(b), nil
}
