package holdfast_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/holdfast/holdfast"
)

// The embedded runtime's queue: a push handler gets what the producer
// enqueued, once it is on disk.
func TestRuntime_QueuePush(t *testing.T) {
	got := make(chan holdfast.QueueDelivery, 1)
	rt, err := holdfast.Open(holdfast.Options{DataDir: t.TempDir(), Types: []holdfast.TypeSpec{{
		Name: "mailer",
		Queue: []holdfast.QueueHandler{{Topic: "welcome", Handle: func(ctx context.Context, m holdfast.QueueDelivery) (holdfast.QueueResult, error) {
			got <- m
			return holdfast.QueueResult{}, nil
		}}},
	}}})
	if err != nil {
		t.Fatal(err)
	}
	defer rt.Close(context.Background())
	q := rt.Queue("app_demo", "mailer", "eu")
	ids, err := q.Enqueue(context.Background(), holdfast.QueueMessageIn{ID: "user-42", Topic: "welcome", Payload: json.RawMessage(`{"to":"ann"}`)})
	if err != nil || ids[0] != "user-42" {
		t.Fatalf("enqueue %v %v", ids, err)
	}
	select {
	case m := <-got:
		if m.ID != "user-42" || string(m.Payload) != `{"to":"ann"}` || m.Attempt != 1 {
			t.Fatalf("pushed %+v", m)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the handler was not called")
	}
}
