package actors

import (
	"context"
	"encoding/json"
	"fmt"
)

// Messages of the KV behaviour. Every object, of any type, answers them.

// KVGet reads the whole state. Reply: *KVState.
type KVGet struct{}

// KVGetSlot reads one slot. Reply: json.RawMessage, or an ErrNotFound error.
type KVGetSlot struct{ Slot string }

// KVWrite changes slots. Reply: *WriteResult.
type KVWrite struct {
	// Ops apply in order, as one write: one log entry, all or nothing.
	Ops []Op
	// Transaction marks a POST /transaction body: an empty list is refused and at
	// most MaxTransactionOps ops are allowed.
	Transaction bool
	// Purge removes every slot and the change log, then records one entry that
	// deletes every slot that existed. Ops must be empty.
	Purge bool
	// IdempotencyKey (1 to 128 bytes, optional): a retry with the same key within
	// 24 hours returns the first reply and writes nothing.
	IdempotencyKey string
	// Route names the API call ("put", "patch", "increment", ...). It takes part in
	// the idempotency fingerprint, so that one key cannot be reused across calls
	// whose ops happen to coincide.
	Route string
}

// Routes of KV writes, for KVWrite.Route.
const (
	RoutePut         = "put"
	RoutePatch       = "patch"
	RouteIncrement   = "increment"
	RouteAppend      = "append"
	RouteDelete      = "delete"
	RouteTransaction = "transaction"
	RoutePurge       = "purge"
)

// KVReadLog reads the change log. Reply: *LogPage, or a *LogTruncatedError.
type KVReadLog struct {
	After uint64 // entries with log_id > After
	Limit int    // log entries, 1 to MaxLogLimit
	// MaxBytes, if above zero, ends the page after the entry that takes its
	// stored bytes to MaxBytes or more (a page holds at least one entry). A
	// websocket's replay reads in such pages (gateway/socket.go).
	MaxBytes int
}

// KVState is an object's state at LogID.
type KVState struct {
	State map[string]json.RawMessage `json:"state"`
	LogID uint64                     `json:"log_id"`
}

// WriteResult is the reply to a KV write.
type WriteResult struct {
	LogID uint64 `json:"log_id"`
	// Value is the new value of an incremented slot (single increment only).
	Value json.RawMessage `json:"value,omitempty"`
	// Changes are what this write changed (nil when it changed nothing or when the
	// reply is a replay of an idempotent retry).
	Changes []Change `json:"-"`
}

// LogItem is one changed slot of one log entry.
type LogItem struct {
	Key   string          `json:"key"`
	Value json.RawMessage `json:"value"`
	LogID uint64          `json:"log_id"`
}

// LogPage is a page of the change log.
type LogPage struct {
	Items []LogItem `json:"items"`
	// Next is the log_id to pass as After for the next page (the last entry read).
	Next uint64 `json:"-"`
}

// Limits of GET /log.
const (
	DefaultLogLimit = 1000
	MaxLogLimit     = 10000
)

// Requester sends a message to an object and returns its reply. cluster.Node and
// Host implement it.
type Requester interface {
	Request(ctx context.Context, id ObjectID, msg any) (any, error)
}

// KV is the Go API of an object's KV behaviour, over any Requester.
type KV struct {
	r  Requester
	id ObjectID
}

// NewKV returns the KV API of object id.
func NewKV(r Requester, id ObjectID) *KV { return &KV{r: r, id: id} }

// ID returns the object's name.
func (o *KV) ID() ObjectID { return o.id }

func ask[T any](ctx context.Context, o *KV, msg any) (T, error) {
	return request[T](ctx, o.r, o.id, msg)
}

// request sends msg to object id and returns its reply as a T.
func request[T any](ctx context.Context, r Requester, id ObjectID, msg any) (T, error) {
	var zero T
	reply, err := r.Request(ctx, id, msg)
	if err != nil {
		return zero, err
	}
	v, ok := reply.(T)
	if !ok {
		return zero, fmt.Errorf("actors: reply %T to %T, want %T", reply, msg, zero)
	}
	return v, nil
}

// Get returns the object's state and log_id.
func (o *KV) Get(ctx context.Context) (*KVState, error) { return ask[*KVState](ctx, o, KVGet{}) }

// GetSlot returns one slot's value; ErrNotFound if it does not exist.
func (o *KV) GetSlot(ctx context.Context, slot string) (json.RawMessage, error) {
	return ask[json.RawMessage](ctx, o, KVGetSlot{Slot: slot})
}

// Write runs w.
func (o *KV) Write(ctx context.Context, w *KVWrite) (*WriteResult, error) {
	return ask[*WriteResult](ctx, o, w)
}

// marshalValue returns v as JSON, and whether it is json.Marshal's output:
// valid, compact and not shared with the caller, so that the plan need not
// check and copy it again. A json.RawMessage is the caller's, checked later.
func marshalValue(v any) (json.RawMessage, bool, error) {
	switch v := v.(type) {
	case json.RawMessage:
		return v, false, nil
	case string:
		if b, ok := quotePlain(v); ok {
			return b, true, nil
		}
	}
	b, err := json.Marshal(v)
	if err != nil {
		return nil, false, badRequestf("value cannot be encoded as JSON: %v", err)
	}
	return b, true, nil
}

// quotePlain quotes s as JSON, byte for byte as json.Marshal does, without its
// reflection for the common string: printable ASCII with nothing to escape is
// quoted as it is, in one pass; anything else (escapes, non-ASCII, and the HTML
// escapes of '<', '>' and '&') goes to json.Marshal (ok false).
func quotePlain(s string) (json.RawMessage, bool) {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c >= 0x7F || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
			return nil, false
		}
	}
	b := make([]byte, len(s)+2)
	b[0] = '"'
	copy(b[1:], s)
	b[len(b)-1] = '"'
	return b, true
}

// Set sets slot to value (any JSON-encodable Go value, or json.RawMessage).
func (o *KV) Set(ctx context.Context, slot string, value any) (*WriteResult, error) {
	raw, compact, err := marshalValue(value)
	if err != nil {
		return nil, err
	}
	return o.Write(ctx, &KVWrite{Route: RoutePut, Ops: []Op{{Op: "set", Key: slot, Value: raw, compact: compact}}})
}

// Patch sets each slot of patch in one write; a nil value deletes the slot. The
// slots change in the order given.
func (o *KV) Patch(ctx context.Context, patch []PatchEntry) (*WriteResult, error) {
	ops := make([]Op, 0, len(patch))
	for _, e := range patch {
		raw, compact, err := marshalValue(e.Value)
		if err != nil {
			return nil, err
		}
		op := PatchOp(e.Slot, raw)
		op.compact = compact
		ops = append(ops, op)
	}
	return o.Write(ctx, &KVWrite{Route: RoutePatch, Ops: ops})
}

// PatchEntry is one slot of a Patch.
type PatchEntry struct {
	Slot  string
	Value any // nil deletes the slot
}

// PatchOp is the op of one merge-patch member: null deletes, anything else sets.
func PatchOp(slot string, value json.RawMessage) Op {
	if string(value) == "null" {
		return Op{Op: "delete", Key: slot}
	}
	return Op{Op: "set", Key: slot, Value: value}
}

// Increment adds by (an int64 or float64) to slot and returns the new value.
func (o *KV) Increment(ctx context.Context, slot string, by any) (*WriteResult, error) {
	raw, _, err := marshalValue(by)
	if err != nil {
		return nil, err
	}
	return o.Write(ctx, &KVWrite{Route: RouteIncrement, Ops: []Op{{Op: "increment", Key: slot, By: raw}}})
}

// Append appends value to the list in slot.
func (o *KV) Append(ctx context.Context, slot string, value any) (*WriteResult, error) {
	raw, compact, err := marshalValue(value)
	if err != nil {
		return nil, err
	}
	return o.Write(ctx, &KVWrite{Route: RouteAppend, Ops: []Op{{Op: "append", Key: slot, Value: raw, compact: compact}}})
}

// Delete removes slot.
func (o *KV) Delete(ctx context.Context, slot string) (*WriteResult, error) {
	return o.Write(ctx, &KVWrite{Route: RouteDelete, Ops: []Op{{Op: "delete", Key: slot}}})
}

// Transaction applies ops in order as one write.
func (o *KV) Transaction(ctx context.Context, ops []Op) (*WriteResult, error) {
	return o.Write(ctx, &KVWrite{Route: RouteTransaction, Ops: ops, Transaction: true})
}

// Purge removes every slot and the change log, keeping log_id monotonic.
func (o *KV) Purge(ctx context.Context) (*WriteResult, error) {
	return o.Write(ctx, &KVWrite{Route: RoutePurge, Purge: true})
}

// Log reads up to limit change-log entries after after.
func (o *KV) Log(ctx context.Context, after uint64, limit int) (*LogPage, error) {
	return ask[*LogPage](ctx, o, KVReadLog{After: after, Limit: limit})
}
