package actors

import (
	"bytes"
	"encoding/json"
	"fmt"
)

// The alarm action {"kind":"enqueue","topic":"...","payload":...} (spec/alarms.md)
// puts a message into the object's queue in the same commit that settles the
// alarm, so it happens exactly once. The message's id is derived from the
// occurrence's idempotency key: the same for every attempt of the occurrence.

type enqueueAction struct {
	Kind    string          `json:"kind"`
	Topic   *string         `json:"topic"`
	Payload json.RawMessage `json:"payload"`
}

func parseEnqueueAction(action json.RawMessage) (*enqueueAction, error) {
	var e enqueueAction
	dec := json.NewDecoder(bytes.NewReader(action))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&e); err != nil {
		return nil, badRequestf(`the enqueue action is {"kind":"enqueue","topic"?: "...","payload": ...}`)
	}
	if len(e.Payload) == 0 {
		return nil, badRequestf("the enqueue action needs a payload")
	}
	if e.Topic != nil && *e.Topic == "" {
		return nil, invalidf("the enqueue action's topic must not be empty: leave it out for the default one")
	}
	return &e, nil
}

// alarmEnqueue runs an enqueue action: the message and the settlement commit
// together; a refusal (the queue is full) is a failed attempt, retried.
func (o *object) alarmEnqueue(a *alarmState, name string, r *alarmRec, call AlarmCall) {
	e, err := parseEnqueueAction(r.Action)
	if err != nil {
		o.alarmSettle(a, name, r.Gen, nil, err, 0)
		return
	}
	q, err := o.queueLoad()
	if err != nil {
		o.alarmSettle(a, name, r.Gen, nil, err, 0)
		return
	}
	in := QueueMessageIn{ID: "alarm-" + call.IdempotencyKey, Payload: e.Payload}
	if e.Topic != nil {
		in.Topic = *e.Topic
	}
	t := newQueueTxn(q)
	if _, err := o.queueStageEnqueue(t, []QueueMessageIn{in}); err != nil {
		o.alarmSettle(a, name, r.Gen, nil, fmt.Errorf("enqueue: %w", err), 0)
		return
	}
	o.queueFinish(t)
	o.alarmSettleWith(a, name, r.Gen, nil, nil, 0, &t.w)
	o.queuePump()
}
