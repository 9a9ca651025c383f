package client

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/url"
	"strconv"
)

// Queue is a write-ahead queue's routes (spec/queue.md).
type Queue struct {
	c        *Client
	typ, key string
}

// Queue returns the queue of object (typ, key).
func (c *Client) Queue(typ, key string) *Queue { return &Queue{c: c, typ: typ, key: key} }

// Message is a message to enqueue: Payload (any JSON value), an optional ID
// (the same id again enqueues nothing), Topic, and DeliverAt (unix ms) or
// DelayMs to postpone it.
type Message struct {
	ID        string `json:"id,omitempty"`
	Topic     string `json:"topic,omitempty"`
	Payload   any    `json:"payload"`
	DeliverAt int64  `json:"deliverAt,omitempty"`
	DelayMs   int64  `json:"delayMs,omitempty"`
}

// Delivery is a received message and its receipt.
type Delivery struct {
	ID         string          `json:"id"`
	Topic      string          `json:"topic"`
	Payload    json.RawMessage `json:"payload"`
	Attempt    int             `json:"attempt"`
	EnqueuedAt int64           `json:"enqueuedAt"`
	Receipt    string          `json:"receipt"`
}

// Enqueue enqueues messages atomically and returns their ids.
func (q *Queue) Enqueue(ctx context.Context, messages ...Message) ([]string, error) {
	if messages == nil {
		messages = []Message{}
	}
	var r struct {
		IDs []string `json:"ids"`
	}
	if _, err := q.c.Do(ctx, http.MethodPost, q.c.path("queues", q.typ, q.key, "messages"), nil, nil, map[string]any{"messages": messages}, &r); err != nil {
		return nil, err
	}
	return r.IDs, nil
}

// Receive takes up to max messages that are due (0: the server's default),
// waiting up to waitMs for one (0: no wait).
func (q *Queue) Receive(ctx context.Context, max, waitMs int) ([]Delivery, error) {
	body := map[string]any{}
	if max > 0 {
		body["max"] = max
	}
	if waitMs > 0 {
		body["waitMs"] = waitMs
	}
	var r struct {
		Messages []Delivery `json:"messages"`
	}
	if _, err := q.c.Do(ctx, http.MethodPost, q.c.path("queues", q.typ, q.key, "receive"), nil, nil, body, &r); err != nil {
		return nil, err
	}
	return r.Messages, nil
}

// Ack completes the deliveries whose receipts are given and returns how many
// it completed. When some receipt is no longer held (the delivery expired or
// was settled), the others are completed all the same and the error is an
// *Error with Code "lease_not_held", returned with the count.
func (q *Queue) Ack(ctx context.Context, receipts ...string) (int, error) {
	if receipts == nil {
		receipts = []string{}
	}
	var r struct {
		Acked int `json:"acked"`
	}
	_, err := q.c.Do(ctx, http.MethodPost, q.c.path("queues", q.typ, q.key, "ack"), nil, nil, map[string]any{"receipts": receipts}, &r)
	var e *Error
	if errors.As(err, &e) && e.Code == "lease_not_held" {
		if n, ok := e.Body["acked"].(json.Number); ok {
			acked, _ := n.Int64()
			return int(acked), err
		}
	}
	if err != nil {
		return 0, err
	}
	return r.Acked, nil
}

// DeadLetter is a message whose delivery to a target failed for good: its
// attempts were spent, or a handler said it cannot succeed. FailedAt is unix
// milliseconds. (The server's definition is actors.QueueDeadLetter; a test
// checks that every field of it is here.)
type DeadLetter struct {
	ID        string          `json:"id"`
	Target    string          `json:"target"`
	Topic     string          `json:"topic"`
	Payload   json.RawMessage `json:"payload"`
	Attempts  int             `json:"attempts"`
	Reason    string          `json:"reason"`
	LastError string          `json:"lastError"`
	FailedAt  int64           `json:"failedAt"`
}

// DeadLetterQuery narrows a listing of dead letters: at most Limit (0: the
// server's default, 100), of one Target and one Topic when set.
type DeadLetterQuery struct {
	Limit         int
	Target, Topic string
}

// DeadLetters lists the queue's dead letters, oldest failure first.
func (q *Queue) DeadLetters(ctx context.Context, query DeadLetterQuery) ([]DeadLetter, error) {
	v := url.Values{}
	if query.Limit > 0 {
		v.Set("limit", strconv.Itoa(query.Limit))
	}
	if query.Target != "" {
		v.Set("target", query.Target)
	}
	if query.Topic != "" {
		v.Set("topic", query.Topic)
	}
	var r struct {
		DeadLetters []DeadLetter `json:"deadLetters"`
	}
	if _, err := q.c.Do(ctx, http.MethodGet, q.c.path("queues", q.typ, q.key, "dead-letters"), v, nil, nil, &r); err != nil {
		return nil, err
	}
	return r.DeadLetters, nil
}
