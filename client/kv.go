package client

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
)

// Object is a KV object's routes (spec/objects.md).
type Object struct {
	c        *Client
	typ, key string
}

// Object returns the object (typ, key) of the client's app.
func (c *Client) Object(typ, key string) *Object { return &Object{c: c, typ: typ, key: key} }

// State is an object's slots at LogID.
type State struct {
	State map[string]json.RawMessage `json:"state"`
	LogID uint64                     `json:"log_id"`
}

// WriteResult is a write's reply: the object's log_id after it, and for an
// increment the slot's new value.
type WriteResult struct {
	LogID uint64          `json:"log_id"`
	Value json.RawMessage `json:"value,omitempty"`
}

// Op is one operation of a transaction: set (Value), delete, increment (By,
// a number; nil adds 1) or append (Value), on slot Key.
type Op struct {
	Op    string          `json:"op"`
	Key   string          `json:"key"`
	Value json.RawMessage `json:"value,omitempty"`
	By    json.RawMessage `json:"by,omitempty"`
}

// WriteOption qualifies a write.
type WriteOption func(*writeOpts)

type writeOpts struct{ idempotencyKey string }

// IdempotencyKey makes the write idempotent under key (1 to 128 bytes, per
// object, for 24 hours): a retry with the same key and request gets the first
// reply and writes nothing.
func IdempotencyKey(key string) WriteOption { return func(o *writeOpts) { o.idempotencyKey = key } }

func writeHeader(opts []WriteOption) http.Header {
	var o writeOpts
	for _, f := range opts {
		f(&o)
	}
	if o.idempotencyKey == "" {
		return nil
	}
	return http.Header{"Idempotency-Key": {o.idempotencyKey}}
}

// Get reads the whole state.
func (o *Object) Get(ctx context.Context) (*State, error) {
	var st State
	_, err := o.c.Do(ctx, http.MethodGet, o.c.path("objects", o.typ, o.key), nil, nil, nil, &st)
	if err != nil {
		return nil, err
	}
	return &st, nil
}

// GetSlot reads one slot's value; a missing slot is an *Error with Status 404
// (IsNotFound).
func (o *Object) GetSlot(ctx context.Context, slot string) (json.RawMessage, error) {
	var r struct {
		Value json.RawMessage `json:"value"`
	}
	if _, err := o.c.Do(ctx, http.MethodGet, o.c.path("objects", o.typ, o.key, slot), nil, nil, nil, &r); err != nil {
		return nil, err
	}
	return r.Value, nil
}

func (o *Object) write(ctx context.Context, method, path string, body any, opts []WriteOption) (*WriteResult, error) {
	var r WriteResult
	if _, err := o.c.Do(ctx, method, path, nil, writeHeader(opts), body, &r); err != nil {
		return nil, err
	}
	return &r, nil
}

// Set sets slot to v (any JSON value; json.RawMessage as is).
func (o *Object) Set(ctx context.Context, slot string, v any, opts ...WriteOption) (*WriteResult, error) {
	raw, err := value(v)
	if err != nil {
		return nil, err
	}
	return o.write(ctx, http.MethodPut, o.c.path("objects", o.typ, o.key, slot), map[string]json.RawMessage{"value": raw}, opts)
}

// Increment adds by (a number) to slot; the result's Value is the new value.
func (o *Object) Increment(ctx context.Context, slot string, by any, opts ...WriteOption) (*WriteResult, error) {
	raw, err := value(by)
	if err != nil {
		return nil, err
	}
	return o.write(ctx, http.MethodPost, o.c.path("objects", o.typ, o.key, slot, "increment"), map[string]json.RawMessage{"by": raw}, opts)
}

// Append appends v to the array in slot.
func (o *Object) Append(ctx context.Context, slot string, v any, opts ...WriteOption) (*WriteResult, error) {
	raw, err := value(v)
	if err != nil {
		return nil, err
	}
	return o.write(ctx, http.MethodPost, o.c.path("objects", o.typ, o.key, slot, "append"), map[string]json.RawMessage{"value": raw}, opts)
}

// Delete deletes slot.
func (o *Object) Delete(ctx context.Context, slot string, opts ...WriteOption) (*WriteResult, error) {
	return o.write(ctx, http.MethodDelete, o.c.path("objects", o.typ, o.key, slot), nil, opts)
}

// Patch sets several slots in one write: a nil value (or JSON null) deletes
// its slot. Slots apply in no particular order; use PatchRaw for an ordered
// body.
func (o *Object) Patch(ctx context.Context, slots map[string]any, opts ...WriteOption) (*WriteResult, error) {
	body := make(map[string]json.RawMessage, len(slots))
	for k, v := range slots {
		raw, err := value(v)
		if err != nil {
			return nil, err
		}
		body[k] = raw
	}
	b, err := json.Marshal(body)
	if err != nil {
		return nil, fmt.Errorf("client: encode the patch: %w", err)
	}
	return o.PatchRaw(ctx, b, opts...)
}

// PatchRaw sends body, a JSON object of slots, as the PATCH body.
func (o *Object) PatchRaw(ctx context.Context, body json.RawMessage, opts ...WriteOption) (*WriteResult, error) {
	return o.write(ctx, http.MethodPatch, o.c.path("objects", o.typ, o.key), body, opts)
}

// Transaction applies ops atomically: all or none.
func (o *Object) Transaction(ctx context.Context, ops []Op, opts ...WriteOption) (*WriteResult, error) {
	if ops == nil {
		ops = []Op{}
	}
	return o.write(ctx, http.MethodPost, o.c.path("objects", o.typ, o.key, "transaction"), ops, opts)
}

// Purge deletes the object's state (its log_id moves on).
func (o *Object) Purge(ctx context.Context, opts ...WriteOption) error {
	_, err := o.c.Do(ctx, http.MethodDelete, o.c.path("objects", o.typ, o.key), nil, writeHeader(opts), nil, nil)
	return err
}

// Change is one changed slot of the object's change log.
type Change struct {
	Key   string          `json:"key"`
	Value json.RawMessage `json:"value"` // null: deleted
	LogID uint64          `json:"log_id"`
}

// Changes reads the change log after log_id after, at most limit entries (0:
// the server's default). A log that no longer holds them is an *Error with
// Status 410.
func (o *Object) Changes(ctx context.Context, after uint64, limit int) ([]Change, error) {
	q := url.Values{"after": {itoa(after)}}
	if limit > 0 {
		q.Set("limit", itoa(uint64(limit)))
	}
	var r struct {
		Items []Change `json:"items"`
	}
	if _, err := o.c.Do(ctx, http.MethodGet, o.c.path("objects", o.typ, o.key, "log"), q, nil, nil, &r); err != nil {
		return nil, err
	}
	return r.Items, nil
}
