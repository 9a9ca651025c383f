package holdfast

import (
	"context"
	"encoding/json"
	"fmt"
)

// Typed helpers: a slot's value, and a user type's reply, as Go types, with
// no type assertion and no JSON in the caller.
//
//	n, err := holdfast.Get[int](ctx, rt.Object("app", "counter", "c1"), "n")
//	total, err := holdfast.Call[int](ctx, rt, "app", "counter", "c1", Add{By: 2})
//
// and, in a user type's handler, its own storage as Go values:
//
//	n, err := holdfast.Load[int64](c, "value") // 0 when absent
//	err = holdfast.Save(c, "value", n+1)       // durable before the reply

// Get returns slot's value decoded into a T (ErrNotFound, through errors.Is,
// when the slot does not exist).
func Get[T any](ctx context.Context, obj *Object, slot string) (T, error) {
	var v T
	raw, err := obj.GetSlot(ctx, slot)
	if err != nil {
		return v, err
	}
	if err := json.Unmarshal(raw, &v); err != nil {
		return v, fmt.Errorf("holdfast: slot %q of %s holds %s, not a %T: %w", slot, obj.ID(), raw, v, err)
	}
	return v, nil
}

// Call sends msg to object (app, typ, key), a user-defined type's, and
// returns its handler's reply as an R. A reply of another type is an error
// that names both (the handler and the caller disagree), never a panic.
func Call[R any](ctx context.Context, r *Runtime, app, typ, key string, msg any) (R, error) {
	var zero R
	v, err := r.Request(ctx, app, typ, key, msg)
	if err != nil {
		return zero, err
	}
	if v == nil {
		return zero, nil
	}
	out, ok := v.(R)
	if !ok {
		return zero, fmt.Errorf("holdfast: %s/%s/%s answered %T to %T, not the %T the caller asked for", app, typ, key, v, msg, zero)
	}
	return out, nil
}

// Load returns the value a user type's handler stored at key with Save,
// decoded into a T, or T's zero value when key holds nothing (as Restate's
// Get does). A value that is not a T is an error that names key.
func Load[T any](c *Context, key string) (T, error) {
	var v T
	raw, found, err := c.Get(key)
	if err != nil || !found {
		return v, err
	}
	if err := json.Unmarshal(raw, &v); err != nil {
		return v, fmt.Errorf("holdfast: storage key %q of %s holds %s, not a %T: %w", key, c.ID(), raw, v, err)
	}
	return v, nil
}

// Save stores v (as JSON) at key in the handler's turn: the turn's writes
// commit together, durably, before its reply leaves.
func Save(c *Context, key string, v any) error {
	raw, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("holdfast: storage key %q: encode a %T: %w", key, v, err)
	}
	return c.Put(key, raw)
}
