// Command email-queue sends emails from a Holdfast write-ahead queue with a Go push
// handler: a temporary SMTP error is retried with backoff, a bounced address goes
// to the dead letters at once, a domain that is down exhausts its attempts; once
// the outage is over its dead letters are redriven and the bounces deleted.
//
//	go run ./examples/email-queue
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/holdfast/holdfast"
	"github.com/holdfast/holdfast/actors"
)

const app = "app_example"

// Email is a message's payload.
type Email struct {
	To      string `json:"to"`
	Subject string `json:"subject"`
}

// Outbox is a fake SMTP server: it counts the attempts and the emails sent.
type Outbox struct {
	mu       sync.Mutex
	down     bool           // down.example refuses connections
	attempts map[string]int // by address
	sent     map[string]int // by address
}

// send delivers e on its attempt-th delivery, or fails like an SMTP server.
func (o *Outbox) send(e Email, attempt int) (holdfast.QueueResult, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.attempts[e.To]++
	switch {
	case strings.HasSuffix(e.To, "@flaky.example") && attempt == 1:
		return holdfast.QueueResult{}, errors.New("421 try again later") // an error retries
	case strings.HasSuffix(e.To, "@nowhere.example"):
		return holdfast.QueueResult{Action: actors.QueueDeadLetterAction, Reason: "550 no such mailbox"}, nil
	case strings.HasSuffix(e.To, "@down.example") && o.down:
		return holdfast.QueueResult{}, errors.New("connection refused")
	}
	o.sent[e.To]++
	return holdfast.QueueResult{}, nil // ack
}

// Mailer is the object type whose queues hold the emails to send.
func Mailer(o *Outbox) holdfast.TypeSpec {
	return holdfast.TypeSpec{Name: "mailer", Queue: []holdfast.QueueHandler{{
		Topic: "email",
		Handle: func(ctx context.Context, m holdfast.QueueDelivery) (holdfast.QueueResult, error) {
			var e Email
			if err := json.Unmarshal(m.Payload, &e); err != nil {
				return holdfast.QueueResult{Action: actors.QueueDeadLetterAction, Reason: "bad payload"}, nil
			}
			return o.send(e, m.Attempt)
		},
	}}}
}

// Open opens a runtime whose mailers retry 3 times, quickly (for the example).
func Open(dir string, o *Outbox) (*holdfast.Runtime, error) {
	return holdfast.Open(holdfast.Options{DataDir: dir, Types: []holdfast.TypeSpec{Mailer(o)},
		TypeOptions: func(typ string) holdfast.TypeOptions {
			opts := actors.DefaultTypeOptions()
			opts.Queue = holdfast.QueueOptions{MaxAttempts: 3, Concurrency: 4,
				Backoff: actors.Backoff{Initial: 20 * time.Millisecond, Max: 200 * time.Millisecond}}
			return opts
		}})
}

// settled polls q until nothing is pending, delayed or processing.
func settled(ctx context.Context, q *holdfast.Queue) (*actors.QueueStats, error) {
	for {
		s, err := q.Stats(ctx)
		if err != nil || s.Pending+s.Delayed+s.Processing == 0 {
			return s, err
		}
		select {
		case <-ctx.Done():
			return s, fmt.Errorf("queue not settled: %+v: %w", *s, ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// Report is what run saw.
type Report struct {
	First, Final actors.QueueStats
	Dead         []actors.QueueDeadLetter // after the first pass
	Redriven     int
}

// run enqueues one email per address, waits until every one is settled, then
// ends the outage, redrives the exhausted dead letters, deletes the rejected
// ones and waits again.
func run(ctx context.Context, rt *holdfast.Runtime, o *Outbox, to []string) (*Report, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	q := rt.Queue(app, "mailer", "eu")
	msgs := make([]holdfast.QueueMessageIn, len(to))
	for i, addr := range to {
		p, _ := json.Marshal(Email{To: addr, Subject: "Welcome!"})
		msgs[i] = holdfast.QueueMessageIn{ID: "welcome/" + addr, Topic: "email", Payload: p}
	}
	if _, err := q.Enqueue(ctx, msgs...); err != nil { // durable when it returns
		return nil, err
	}
	var r Report
	s, err := settled(ctx, q)
	if err != nil {
		return nil, err
	}
	r.First = *s
	if r.Dead, err = q.DeadLetters(ctx, actors.QueueDeadLettersGet{}); err != nil {
		return nil, err
	}
	o.mu.Lock()
	o.down = false // the outage is over
	o.mu.Unlock()
	var exhausted []string
	for _, d := range r.Dead {
		if d.Reason == "exhausted" {
			exhausted = append(exhausted, d.ID)
		} else if err := q.DeleteDeadLetter(ctx, d.ID); err != nil { // a bounce: give up
			return nil, err
		}
	}
	if r.Redriven, err = q.Redrive(ctx, exhausted...); err != nil {
		return nil, err
	}
	if s, err = settled(ctx, q); err != nil {
		return nil, err
	}
	r.Final = *s
	return &r, nil
}

// Addresses are the example's recipients.
var Addresses = []string{
	"ann@ok.example", "bob@ok.example", "cat@ok.example", "dan@ok.example", "eve@ok.example",
	"fay@ok.example", "gus@flaky.example", "hal@flaky.example", "ivy@nowhere.example", "joe@down.example",
}

func main() {
	dir, err := os.MkdirTemp("", "holdfast-email-queue-")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	o := &Outbox{down: true, attempts: map[string]int{}, sent: map[string]int{}}
	ctx := context.Background()
	rt, err := Open(dir, o)
	if err != nil {
		log.Fatal(err)
	}
	defer rt.Close(ctx)
	r, err := run(ctx, rt, o, Addresses)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("first pass: %+v\n", r.First)
	for _, d := range r.Dead {
		fmt.Printf("dead letter %s: %s after %d attempts (%s)\n", d.ID, d.Reason, d.Attempts, d.LastError)
	}
	fmt.Printf("redrove %d; final: %+v\n", r.Redriven, r.Final)
	fmt.Printf("attempts by address: %v\n", o.attempts)
}
