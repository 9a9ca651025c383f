package cluster

import (
	"encoding/json"
	"reflect"

	"github.com/holdfast/holdfast/actors"
)

// Codecs by hand for the messages on the hot path between members: a KV write
// and its reply. msgpack's reflection looks each struct's fields up in a
// sync.Map and decodes them through reflect.Value; for a 256-byte set and its
// reply that was about 2 µs per request, on both members, a tenth of a node's
// CPU per forwarded write (BenchmarkWire_RoundTrip256; the profile of bench
// -case holdfast-client/increments-256). They write wirecodec.go's byte
// slices. Every other type crosses by msgpack's reflection.
// TestWire_FastCodecsCoverEveryField fails when one of these types gains a
// field the codec does not carry.

// fastCodec encodes and decodes the value of one type (not a pointer to it).
type fastCodec struct {
	enc func(wbuf, any) wbuf
	dec func(*rbuf) (any, error)
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

func encKVWrite(b wbuf, v any) wbuf {
	w := v.(actors.KVWrite)
	b = b.arrayLen(kvWriteFields).arrayLen(len(w.Ops))
	for i := range w.Ops {
		o := &w.Ops[i]
		b = b.arrayLen(opFields).str(o.Op).str(o.Key).bin(o.Value).bin(o.By)
	}
	return b.bool(w.Transaction).bool(w.Purge).str(w.IdempotencyKey).str(w.Route)
}

func decKVWrite(r *rbuf) (any, error) {
	var w actors.KVWrite
	if err := r.fields(kvWriteFields, "KVWrite"); err != nil {
		return nil, err
	}
	n, err := r.arrayLen()
	if err != nil {
		return nil, err
	}
	if n > 0 {
		w.Ops = make([]actors.Op, n)
	}
	for i := range w.Ops {
		o := &w.Ops[i]
		if err := r.fields(opFields, "Op"); err != nil {
			return nil, err
		}
		var err1, err2, err3, err4 error
		o.Op, err1 = r.str()
		o.Key, err2 = r.str()
		o.Value, err3 = raw(r.bin())
		o.By, err4 = raw(r.bin())
		if err := firstErr(err1, err2, err3, err4); err != nil {
			return nil, err
		}
	}
	var err1, err2, err3, err4 error
	w.Transaction, err1 = r.bool()
	w.Purge, err2 = r.bool()
	w.IdempotencyKey, err3 = r.str()
	w.Route, err4 = r.str()
	return w, firstErr(err1, err2, err3, err4)
}

func encWriteResult(b wbuf, v any) wbuf {
	r := v.(actors.WriteResult)
	b = b.arrayLen(writeResultFields).uint(r.LogID).bin(r.Value)
	if r.Changes == nil {
		return b.nil()
	}
	b = b.arrayLen(len(r.Changes))
	for i := range r.Changes {
		c := &r.Changes[i]
		b = b.arrayLen(changeFields).str(c.Slot).bin(c.Value).bin(c.Previous)
	}
	return b
}

func decWriteResult(rd *rbuf) (any, error) {
	var r actors.WriteResult
	if err := rd.fields(writeResultFields, "WriteResult"); err != nil {
		return nil, err
	}
	var err1, err2 error
	r.LogID, err1 = rd.uint()
	r.Value, err2 = raw(rd.bin())
	if err := firstErr(err1, err2); err != nil {
		return nil, err
	}
	n, err := rd.arrayLen() // -1: nil
	if err != nil {
		return nil, err
	}
	if n >= 0 {
		r.Changes = make([]actors.Change, n)
	}
	for i := range r.Changes {
		c := &r.Changes[i]
		if err := rd.fields(changeFields, "Change"); err != nil {
			return nil, err
		}
		var err1, err2, err3 error
		c.Slot, err1 = rd.str()
		c.Value, err2 = raw(rd.bin())
		c.Previous, err3 = raw(rd.bin())
		if err := firstErr(err1, err2, err3); err != nil {
			return nil, err
		}
	}
	return r, nil
}

// raw types bytes read by rbuf.bin as a JSON value: nil stays nil, empty
// stays empty (a JSON value is never empty, but the codec does not decide
// that).
func raw(b []byte, err error) (json.RawMessage, error) {
	if b == nil || err != nil {
		return nil, err
	}
	return json.RawMessage(b), nil
}
