package main

import (
	"context"
	"maps"
	"testing"

	"github.com/holdfast/holdfast/actors"
)

// TestEmailQueue checks the counts after the first pass, the dead letters, and
// the counts after the redrive: 9 emails sent once each, none twice.
func TestEmailQueue(t *testing.T) {
	ctx := context.Background()
	o := &Outbox{down: true, attempts: map[string]int{}, sent: map[string]int{}}
	rt, err := Open(t.TempDir(), o)
	if err != nil {
		t.Fatal(err)
	}
	defer rt.Close(ctx)
	r, err := run(ctx, rt, o, Addresses)
	if err != nil {
		t.Fatal(err)
	}
	if want := (actors.QueueStats{Complete: 8, Failed: 2}); r.First != want {
		t.Fatalf("first pass %+v, want %+v", r.First, want)
	}
	dead := map[string]string{}
	for _, d := range r.Dead {
		dead[d.ID] = d.Reason
		if d.ID == "welcome/joe@down.example" && (d.Attempts != 3 || d.LastError != "connection refused") {
			t.Fatalf("dead letter %+v: want 3 attempts, the last error kept", d)
		}
	}
	if want := map[string]string{"welcome/ivy@nowhere.example": "rejected", "welcome/joe@down.example": "exhausted"}; !maps.Equal(dead, want) {
		t.Fatalf("dead letters %v, want %v", dead, want)
	}
	if want := (actors.QueueStats{Complete: 9}); r.Redriven != 1 || r.Final != want {
		t.Fatalf("after the redrive: %d redriven, %+v, want 1 and %+v", r.Redriven, r.Final, want)
	}
	wantAttempts := map[string]int{"gus@flaky.example": 2, "hal@flaky.example": 2, "ivy@nowhere.example": 1, "joe@down.example": 4}
	for _, addr := range Addresses {
		want, sent := 1, 1
		if n, ok := wantAttempts[addr]; ok {
			want = n
		}
		if addr == "ivy@nowhere.example" {
			sent = 0
		}
		if o.attempts[addr] != want || o.sent[addr] != sent {
			t.Errorf("%s: %d attempts, %d sent; want %d and %d", addr, o.attempts[addr], o.sent[addr], want, sent)
		}
	}
}
