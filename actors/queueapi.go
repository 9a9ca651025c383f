package actors

import (
	"context"
	"encoding/json"
	"time"
)

// QueueOptions are the options of a type's write-ahead queues
// (shared/spec/config.md, "queue").
type QueueOptions struct {
	// Targets each get every message, settling it on their own; empty means
	// one target, "default".
	Targets []string
	// MaxAttempts is the deliveries a pair gets before it goes to the dead
	// letters (exhausted); zero means 5.
	MaxAttempts int
	// VisibilityTimeout is how long a received pair stays processing before it
	// counts as a failed attempt; zero means 30s.
	VisibilityTimeout time.Duration
	// Backoff of failed attempts: Initial (zero: 1s) times Multiplier (zero:
	// 2) per further failure, at most Max (zero: 5m), minus up to a fifth
	// (jitter).
	Backoff Backoff
	// MaxPending bounds the pending pairs; enqueue past it is refused (429).
	// Zero means 1,000,000.
	MaxPending int
	// CompletedRetention is how long complete pairs are kept (their ids stay
	// deduplicated); zero means 24h.
	CompletedRetention time.Duration
	// DeadLetterRetention is how long dead letters are kept unless redriven or
	// deleted; zero means 14 days.
	DeadLetterRetention time.Duration
	// Concurrency bounds the messages of one queue in its push handlers at
	// once; zero means 1 (a topic is then processed in order).
	Concurrency int
}

// Backoff is an exponential backoff.
type Backoff struct {
	Initial    time.Duration
	Multiplier float64
	Max        time.Duration
}

// DefaultQueueTarget is the target of a type that names none.
const DefaultQueueTarget = "default"

func (q QueueOptions) withDefaults() QueueOptions {
	if len(q.Targets) == 0 {
		q.Targets = []string{DefaultQueueTarget}
	}
	if q.MaxAttempts <= 0 {
		q.MaxAttempts = 5
	}
	if q.VisibilityTimeout <= 0 {
		q.VisibilityTimeout = 30 * time.Second
	}
	if q.Backoff.Initial <= 0 {
		q.Backoff.Initial = time.Second
	}
	if q.Backoff.Multiplier < 1 {
		q.Backoff.Multiplier = 2
	}
	if q.Backoff.Max <= 0 {
		q.Backoff.Max = 5 * time.Minute
	}
	if q.MaxPending <= 0 {
		q.MaxPending = 1_000_000
	}
	if q.CompletedRetention <= 0 {
		q.CompletedRetention = 24 * time.Hour
	}
	if q.DeadLetterRetention <= 0 {
		q.DeadLetterRetention = 14 * 24 * time.Hour
	}
	return q
}

// QueueMessageIn is one message to enqueue.
type QueueMessageIn struct {
	// ID is the client's id (1 to 128 bytes); empty means a generated one.
	ID string
	// Topic is empty for "default".
	Topic   string
	Payload json.RawMessage
	// DeliverAt (unix ms) or Delay postpones the first delivery.
	DeliverAt int64
	Delay     time.Duration
}

// QueueEnqueue enqueues messages atomically. Reply: *QueueEnqueued.
type QueueEnqueue struct{ Messages []QueueMessageIn }

// QueueEnqueued gives the messages' ids in input order.
type QueueEnqueued struct {
	IDs []string `json:"ids"`
}

// QueueReceive hands out up to Max due pairs of Target (and Topic, when set)
// as processing. Reply: *QueueReceived.
type QueueReceive struct {
	Target string // empty: the type's first target
	Topic  string // empty: every topic
	Max    int    // zero: 1
	// Visibility overrides the type's VisibilityTimeout when positive.
	Visibility time.Duration
}

// QueueReceived is the reply to QueueReceive.
type QueueReceived struct {
	Messages []QueueDelivery `json:"messages"`
}

// QueueDelivery is a received message with its receipt.
type QueueDelivery struct {
	ID         string          `json:"id"`
	Topic      string          `json:"topic"`
	Payload    json.RawMessage `json:"payload"`
	Attempt    int             `json:"attempt"`
	EnqueuedAt int64           `json:"enqueuedAt"`
	Receipt    string          `json:"receipt"`
}

// QueueAck completes the pairs whose receipts are held. Reply: *QueueAcked.
type QueueAck struct{ Receipts []string }

// QueueAcked counts the pairs completed and the receipts not held (already
// settled, expired, or unknown), which changed nothing.
type QueueAcked struct {
	Acked   int `json:"acked"`
	NotHeld int `json:"notHeld"`
}

// QueueNack fails one delivery: the pair backs off (at least Delay), or goes
// to the dead letters when its attempts are spent. Reply: *QueueSettled;
// ErrLeaseNotHeld when the receipt is not held.
type QueueNack struct {
	Receipt string
	Delay   time.Duration
	Error   string
}

// QueueDead moves a received pair to the dead letters (rejected). Reply:
// *QueueSettled; ErrLeaseNotHeld when the receipt is not held.
type QueueDead struct {
	Receipt string
	Reason  string
}

// QueueSettled says where a nacked or dead-lettered pair went.
type QueueSettled struct {
	State string `json:"state"`
}

// QueueMessageGet reads a message and its pairs. Reply: *QueueMessage.
type QueueMessageGet struct{ ID string }

// QueueMessage is a message with the state of each target's pair.
type QueueMessage struct {
	ID         string               `json:"id"`
	Topic      string               `json:"topic"`
	Payload    json.RawMessage      `json:"payload"`
	EnqueuedAt int64                `json:"enqueuedAt"`
	Targets    map[string]QueuePair `json:"targets"`
}

// QueuePair is one (message, target) pair's state.
type QueuePair struct {
	State         string `json:"state"`
	Attempts      int    `json:"attempts"`
	NextAttemptAt int64  `json:"nextAttemptAt,omitempty"`
	LastError     string `json:"lastError"`
	Reason        string `json:"reason,omitempty"`
}

// QueueStatsGet counts the queue's pairs by state. Reply: *QueueStats.
type QueueStatsGet struct{}

// QueueStats counts pairs: Pending are due now, Delayed wait for their time.
type QueueStats struct {
	Pending    int `json:"pending"`
	Delayed    int `json:"delayed"`
	Processing int `json:"processing"`
	Complete   int `json:"complete"`
	Failed     int `json:"failed"`
}

// Queue is the Go API of an object's write-ahead queue, over any Requester.
type Queue struct {
	r  Requester
	id ObjectID
}

// NewQueue returns the queue API of object id.
func NewQueue(r Requester, id ObjectID) *Queue { return &Queue{r: r, id: id} }

// Enqueue enqueues messages atomically, durably, and returns their ids.
func (q *Queue) Enqueue(ctx context.Context, msgs ...QueueMessageIn) ([]string, error) {
	r, err := request[*QueueEnqueued](ctx, q.r, q.id, QueueEnqueue{Messages: msgs})
	if err != nil {
		return nil, err
	}
	return r.IDs, nil
}

// Receive hands out due messages of one target.
func (q *Queue) Receive(ctx context.Context, m QueueReceive) ([]QueueDelivery, error) {
	r, err := request[*QueueReceived](ctx, q.r, q.id, m)
	if err != nil {
		return nil, err
	}
	return r.Messages, nil
}

// Ack completes received messages.
func (q *Queue) Ack(ctx context.Context, receipts ...string) (*QueueAcked, error) {
	return request[*QueueAcked](ctx, q.r, q.id, QueueAck{Receipts: receipts})
}

// Nack fails one delivery.
func (q *Queue) Nack(ctx context.Context, m QueueNack) (*QueueSettled, error) {
	return request[*QueueSettled](ctx, q.r, q.id, m)
}

// Dead moves one received message's pair to the dead letters.
func (q *Queue) Dead(ctx context.Context, m QueueDead) (*QueueSettled, error) {
	return request[*QueueSettled](ctx, q.r, q.id, m)
}

// Message reads one message and its pairs.
func (q *Queue) Message(ctx context.Context, id string) (*QueueMessage, error) {
	return request[*QueueMessage](ctx, q.r, q.id, QueueMessageGet{ID: id})
}

// Stats counts the queue's pairs by state.
func (q *Queue) Stats(ctx context.Context) (*QueueStats, error) {
	return request[*QueueStats](ctx, q.r, q.id, QueueStatsGet{})
}

// DeadLetters lists dead letters, oldest first.
func (q *Queue) DeadLetters(ctx context.Context, m QueueDeadLettersGet) ([]QueueDeadLetter, error) {
	r, err := request[*QueueDeadLetters](ctx, q.r, q.id, m)
	if err != nil {
		return nil, err
	}
	return r.DeadLetters, nil
}

// Redrive puts dead letters back to pending with a fresh attempt budget (every
// dead letter when no ids are given) and returns how many pairs it redrove.
func (q *Queue) Redrive(ctx context.Context, ids ...string) (int, error) {
	r, err := request[*QueueRedriven](ctx, q.r, q.id, QueueRedrive{IDs: ids})
	if err != nil {
		return 0, err
	}
	return r.Redriven, nil
}

// DeleteDeadLetter deletes one message's dead letters.
func (q *Queue) DeleteDeadLetter(ctx context.Context, id string) error {
	_, err := request[*QueueRedriven](ctx, q.r, q.id, QueueDeadLetterDelete{ID: id})
	return err
}
