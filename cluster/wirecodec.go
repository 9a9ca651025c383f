package cluster

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math"

	"github.com/vmihailenco/msgpack/v5"
	"github.com/vmihailenco/msgpack/v5/msgpcode"
)

// MessagePack by hand, on byte slices, for the envelopes and the hot-path
// messages (wire.go, wirefast.go): encoding appends to a slice, decoding
// walks one. msgpack's Encoder and Decoder put an interface call, a
// bytes.Reader and a growing bytes.Buffer under every field: in the forward
// benchmark (bench -cluster, other-64) encoding and decoding the envelopes
// through them was a fifth of the CPU. The bytes are MessagePack all the
// same: a value without a codec of its own is encoded by msgpack's
// reflection into the same slice (wbuf.msgpack), and read back by msgpack
// from where it starts (rbuf.msgpack).

// wbuf is MessagePack being appended.
type wbuf []byte

func (b wbuf) nil() wbuf { return append(b, msgpcode.Nil) }

func (b wbuf) bool(v bool) wbuf {
	if v {
		return append(b, msgpcode.True)
	}
	return append(b, msgpcode.False)
}

func (b wbuf) uint(v uint64) wbuf {
	switch {
	case v <= math.MaxInt8:
		return append(b, byte(v))
	case v <= math.MaxUint8:
		return append(b, msgpcode.Uint8, byte(v))
	case v <= math.MaxUint16:
		return binary.BigEndian.AppendUint16(append(b, msgpcode.Uint16), uint16(v))
	case v <= math.MaxUint32:
		return binary.BigEndian.AppendUint32(append(b, msgpcode.Uint32), uint32(v))
	}
	return binary.BigEndian.AppendUint64(append(b, msgpcode.Uint64), v)
}

func (b wbuf) int(v int64) wbuf {
	switch {
	case v >= 0:
		return b.uint(uint64(v))
	case v >= -32:
		return append(b, byte(v))
	case v >= math.MinInt8:
		return append(b, msgpcode.Int8, byte(v))
	case v >= math.MinInt16:
		return binary.BigEndian.AppendUint16(append(b, msgpcode.Int16), uint16(v))
	case v >= math.MinInt32:
		return binary.BigEndian.AppendUint32(append(b, msgpcode.Int32), uint32(v))
	}
	return binary.BigEndian.AppendUint64(append(b, msgpcode.Int64), uint64(v))
}

func (b wbuf) str(s string) wbuf {
	n := len(s)
	switch {
	case n < 32:
		b = append(b, msgpcode.FixedStrLow|byte(n))
	case n <= math.MaxUint8:
		b = append(b, msgpcode.Str8, byte(n))
	case n <= math.MaxUint16:
		b = binary.BigEndian.AppendUint16(append(b, msgpcode.Str16), uint16(n))
	default:
		b = binary.BigEndian.AppendUint32(append(b, msgpcode.Str32), uint32(n))
	}
	return append(b, s...)
}

// bin writes p as binary; nil as nil (and empty as empty), as msgpack's
// EncodeBytes does.
func (b wbuf) bin(p []byte) wbuf {
	if p == nil {
		return b.nil()
	}
	n := len(p)
	switch {
	case n <= math.MaxUint8:
		b = append(b, msgpcode.Bin8, byte(n))
	case n <= math.MaxUint16:
		b = binary.BigEndian.AppendUint16(append(b, msgpcode.Bin16), uint16(n))
	default:
		b = binary.BigEndian.AppendUint32(append(b, msgpcode.Bin32), uint32(n))
	}
	return append(b, p...)
}

func (b wbuf) arrayLen(n int) wbuf {
	switch {
	case n < 16:
		return append(b, msgpcode.FixedArrayLow|byte(n))
	case n <= math.MaxUint16:
		return binary.BigEndian.AppendUint16(append(b, msgpcode.Array16), uint16(n))
	}
	return binary.BigEndian.AppendUint32(append(b, msgpcode.Array32), uint32(n))
}

// msgpack appends v as msgpack's reflection encodes it (structs as arrays).
func (b wbuf) msgpack(v any) (wbuf, error) {
	buf := bytes.NewBuffer(b)
	enc := msgpack.GetEncoder()
	enc.Reset(buf)
	enc.UseArrayEncodedStructs(true)
	err := enc.Encode(v)
	msgpack.PutEncoder(enc)
	return buf.Bytes(), err
}

// rbuf is MessagePack being read: p is what is left.
type rbuf struct{ p []byte }

var errShort = errors.New("cluster: a message ends early")

func (r *rbuf) code() (byte, error) {
	if len(r.p) == 0 {
		return 0, errShort
	}
	c := r.p[0]
	r.p = r.p[1:]
	return c, nil
}

// take returns the next n bytes (not a copy).
func (r *rbuf) take(n int) ([]byte, error) {
	if n < 0 || len(r.p) < n {
		return nil, errShort
	}
	b := r.p[:n]
	r.p = r.p[n:]
	return b, nil
}

// size reads a big-endian length or number of n bytes.
func (r *rbuf) size(n int) (uint64, error) {
	b, err := r.take(n)
	if err != nil {
		return 0, err
	}
	switch n {
	case 1:
		return uint64(b[0]), nil
	case 2:
		return uint64(binary.BigEndian.Uint16(b)), nil
	case 4:
		return uint64(binary.BigEndian.Uint32(b)), nil
	}
	return binary.BigEndian.Uint64(b), nil
}

// isNil reports whether a nil is next, and takes it if so.
func (r *rbuf) isNil() bool {
	if len(r.p) > 0 && r.p[0] == msgpcode.Nil {
		r.p = r.p[1:]
		return true
	}
	return false
}

func (r *rbuf) bool() (bool, error) {
	c, err := r.code()
	switch {
	case err != nil:
		return false, err
	case c == msgpcode.True:
		return true, nil
	case c == msgpcode.False, c == msgpcode.Nil:
		return false, nil
	}
	return false, fmt.Errorf("cluster: a bool coded %#x", c)
}

// int reads any integer encoding.
func (r *rbuf) int() (int64, error) {
	c, err := r.code()
	if err != nil {
		return 0, err
	}
	switch {
	case msgpcode.IsFixedNum(c):
		return int64(int8(c)), nil
	case c == msgpcode.Nil:
		return 0, nil
	case c == msgpcode.Uint8, c == msgpcode.Uint16, c == msgpcode.Uint32, c == msgpcode.Uint64:
		v, err := r.size(1 << (c - msgpcode.Uint8))
		return int64(v), err
	case c == msgpcode.Int8:
		v, err := r.size(1)
		return int64(int8(v)), err
	case c == msgpcode.Int16:
		v, err := r.size(2)
		return int64(int16(v)), err
	case c == msgpcode.Int32:
		v, err := r.size(4)
		return int64(int32(v)), err
	case c == msgpcode.Int64:
		v, err := r.size(8)
		return int64(v), err
	}
	return 0, fmt.Errorf("cluster: an integer coded %#x", c)
}

func (r *rbuf) uint() (uint64, error) {
	v, err := r.int()
	return uint64(v), err
}

// strBytes reads a string or binary's bytes (not a copy); nil as nil.
func (r *rbuf) strBytes() ([]byte, error) {
	c, err := r.code()
	if err != nil {
		return nil, err
	}
	var n uint64
	switch {
	case c == msgpcode.Nil:
		return nil, nil
	case msgpcode.IsFixedString(c):
		n = uint64(c & msgpcode.FixedStrMask)
	case c == msgpcode.Str8, c == msgpcode.Bin8:
		n, err = r.size(1)
	case c == msgpcode.Str16, c == msgpcode.Bin16:
		n, err = r.size(2)
	case c == msgpcode.Str32, c == msgpcode.Bin32:
		n, err = r.size(4)
	default:
		return nil, fmt.Errorf("cluster: a string coded %#x", c)
	}
	if err != nil {
		return nil, err
	}
	b, err := r.take(int(n))
	if b == nil && err == nil {
		b = []byte{}
	}
	return b, err
}

func (r *rbuf) str() (string, error) {
	b, err := r.strBytes()
	return string(b), err
}

// bin reads what wbuf.bin wrote, as a copy: nil stays nil, empty empty.
func (r *rbuf) bin() ([]byte, error) {
	b, err := r.strBytes()
	if b == nil || err != nil {
		return nil, err
	}
	return append(make([]byte, 0, len(b)), b...), nil
}

// arrayLen reads an array header; -1 for nil.
func (r *rbuf) arrayLen() (int, error) {
	c, err := r.code()
	if err != nil {
		return 0, err
	}
	var n uint64
	switch {
	case c == msgpcode.Nil:
		return -1, nil
	case c >= msgpcode.FixedArrayLow && c <= msgpcode.FixedArrayHigh:
		return int(c & msgpcode.FixedArrayMask), nil
	case c == msgpcode.Array16:
		n, err = r.size(2)
	case c == msgpcode.Array32:
		n, err = r.size(4)
	default:
		return 0, fmt.Errorf("cluster: an array coded %#x", c)
	}
	if err == nil && n > uint64(len(r.p)) { // every element takes a byte at least
		err = errShort
	}
	return int(n), err
}

// fields reads an array header of want elements (a struct of want fields).
func (r *rbuf) fields(want int, what string) error {
	n, err := r.arrayLen()
	if err != nil {
		return err
	}
	if n != want {
		return fmt.Errorf("cluster: a %s of %d fields, want %d", what, n, want)
	}
	return nil
}

// msgpack decodes the next value into v (a pointer) with msgpack's
// reflection, and moves past it.
func (r *rbuf) msgpack(v any) error {
	rd := bytes.NewReader(r.p)
	dec := msgpack.GetDecoder()
	dec.Reset(rd)
	err := dec.Decode(v)
	msgpack.PutDecoder(dec)
	r.p = r.p[len(r.p)-rd.Len():]
	return err
}
