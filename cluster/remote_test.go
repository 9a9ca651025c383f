package cluster

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/holdfast/holdfast/actors"
)

// TestCluster_LostReplyIsNoticedByThePing: the owner runs a forwarded request
// but its reply is lost on the way (as when a connection breaks and comes back,
// which drops what was sent meanwhile). The caller's next ping says the owner
// is not running the request any more, so the caller answers 503 (outcome
// unknown) within a couple of seconds instead of waiting out its deadline.
func TestCluster_LostReplyIsNoticedByThePing(t *testing.T) {
	tc := newTestCluster(t)
	a := tc.start("a")
	b := tc.start("b")
	tc.waitStable(30 * time.Second)
	key := keysOwnedBy(t, a, "b", 1)[0]
	drop := func(op int) bool { return op == opObject }
	b.member.tr.dropReply.Store(&drop)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	start := time.Now()
	_, err := tc.set(ctx, a, key, "v", 1)
	took := time.Since(start)
	var e *actors.Error
	if !errors.As(err, &e) || e.Kind != actors.KindUnavailable {
		t.Fatalf("a request whose reply was lost: %v, want unavailable", err)
	}
	if took > 5*time.Second {
		t.Fatalf("a request whose reply was lost took %v to fail", took)
	}
	// The write itself ran on b: its outcome was unknown, not failed.
	b.member.tr.dropReply.Store(nil)
	st, _, err := tc.get(context.Background(), a, key)
	if err != nil || string(st.State["v"]) != "1" {
		t.Fatalf("after the lost reply: %+v %v", st, err)
	}
	t.Logf("the lost reply was noticed after %v", took)
	if _, err := tc.set(context.Background(), a, key, "v", 2); err != nil {
		t.Fatal(err)
	}
}
