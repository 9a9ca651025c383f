package client

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
)

// MaxBatchOps is the most operations one Batch may carry.
const MaxBatchOps = 1000

// BatchOp is one operation of a batch (spec/batch.md): Op on Object
// ("type/key"), with Fields its route's body fields. Build them with the
// constructors (SetOp, IncrementOp, ...) or by hand for any op the batch
// route takes.
type BatchOp struct {
	Object string
	Op     string
	// Slot is the slot of the routes that name one ("" none).
	Slot string
	// IdempotencyKey is the write's key ("" none).
	IdempotencyKey string
	// Fields are the route's body fields (for patch: the slots).
	Fields map[string]json.RawMessage
	err    error
}

// MarshalJSON writes the operation as the batch route reads it.
func (op BatchOp) MarshalJSON() ([]byte, error) {
	if op.err != nil {
		return nil, op.err
	}
	m := make(map[string]json.RawMessage, len(op.Fields)+4)
	for k, v := range op.Fields {
		m[k] = v
	}
	for k, v := range map[string]string{"object": op.Object, "op": op.Op, "slot": op.Slot, "idempotencyKey": op.IdempotencyKey} {
		if v != "" {
			if _, clash := op.Fields[k]; clash {
				return nil, fmt.Errorf("client: batch op %s: the field %q is set twice", op.Op, k)
			}
			m[k], _ = json.Marshal(v)
		}
	}
	return json.Marshal(m)
}

func opWith(object, op, slot string, fields map[string]any) BatchOp {
	b := BatchOp{Object: object, Op: op, Slot: slot, Fields: map[string]json.RawMessage{}}
	for k, v := range fields {
		raw, err := value(v)
		if err != nil {
			b.err = err
		}
		b.Fields[k] = raw
	}
	return b
}

// GetOp reads slot of object ("type/key"), or its whole state when slot is "".
func GetOp(object, slot string) BatchOp { return opWith(object, "get", slot, nil) }

// SetOp sets slot of object to v.
func SetOp(object, slot string, v any) BatchOp {
	return opWith(object, "set", slot, map[string]any{"value": v})
}

// IncrementOp adds by to slot of object.
func IncrementOp(object, slot string, by any) BatchOp {
	return opWith(object, "increment", slot, map[string]any{"by": by})
}

// AppendOp appends v to the array in slot of object.
func AppendOp(object, slot string, v any) BatchOp {
	return opWith(object, "append", slot, map[string]any{"value": v})
}

// DeleteOp deletes slot of object.
func DeleteOp(object, slot string) BatchOp { return opWith(object, "delete", slot, nil) }

// TransactionOp applies ops to object atomically.
func TransactionOp(object string, ops []Op) BatchOp {
	if ops == nil {
		ops = []Op{}
	}
	return opWith(object, "transaction", "", map[string]any{"ops": ops})
}

// LogAppendOp appends records to the log of object.
func LogAppendOp(object string, records ...Record) BatchOp {
	return opWith(object, "log.append", "", map[string]any{"records": records})
}

// EnqueueOp enqueues messages on the queue of object.
func EnqueueOp(object string, messages ...Message) BatchOp {
	return opWith(object, "queue.enqueue", "", map[string]any{"messages": messages})
}

// WithIdempotencyKey returns op with its idempotency key set.
func (op BatchOp) WithIdempotencyKey(key string) BatchOp {
	op.IdempotencyKey = key
	return op
}

// BatchResult is one operation's result: the status and body its own route
// would have answered. Err is the *Error of a status that is not 2xx.
type BatchResult struct {
	Status int
	Body   json.RawMessage
	Err    error
}

// Decode decodes the result's body into out (a *WriteResult for a write, a
// *State for a get without a slot, ...); a failed operation returns its Err.
func (r BatchResult) Decode(out any) error {
	if r.Err != nil {
		return r.Err
	}
	if len(r.Body) == 0 {
		return nil
	}
	return json.Unmarshal(r.Body, out)
}

// Batch runs up to MaxBatchOps operations in one request: each as its own
// request would (validation, idempotency, durability), the operations of one
// object in their order, and returns one result per operation, in order. An
// operation that fails stops nothing; the error is the batch's own (a
// malformed batch, a refused request), never an operation's.
func (c *Client) Batch(ctx context.Context, ops ...BatchOp) ([]BatchResult, error) {
	if len(ops) > MaxBatchOps {
		return nil, fmt.Errorf("client: a batch carries at most %d operations, not %d", MaxBatchOps, len(ops))
	}
	if ops == nil {
		ops = []BatchOp{}
	}
	var reply struct {
		Results []struct {
			Status int             `json:"status"`
			Body   json.RawMessage `json:"body"`
		} `json:"results"`
	}
	if _, err := c.Do(ctx, http.MethodPost, "/api/v1/batch/"+url.PathEscape(c.key), nil, nil, map[string]any{"ops": ops}, &reply); err != nil {
		return nil, err
	}
	if len(reply.Results) != len(ops) {
		return nil, fmt.Errorf("client: the batch's reply has %d results for %d operations", len(reply.Results), len(ops))
	}
	out := make([]BatchResult, len(ops))
	for i, r := range reply.Results {
		out[i] = BatchResult{Status: r.Status, Body: r.Body}
		if r.Status < 200 || r.Status > 299 {
			out[i].Err = decodeError(r.Status, http.Header{}, r.Body)
		}
	}
	return out, nil
}
