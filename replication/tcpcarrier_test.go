package replication_test

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/holdfast/holdfast/replication"
)

// TestTCPCarrier_OversizeFrameAndRedial: a frame over the receiver's limit is
// never handed over and closes the connection; the sender notices and its
// next frames go through a new connection, in order.
func TestTCPCarrier_OversizeFrameAndRedial(t *testing.T) {
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	var mu sync.Mutex
	var got [][]byte
	recv, err := replication.ListenTCP(replication.TCPConfig{Bind: "127.0.0.1:0", MaxFrame: 1 << 10, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	defer recv.Close()
	recv.SetHandler(func(f []byte) {
		mu.Lock()
		got = append(got, append([]byte(nil), f...))
		mu.Unlock()
	})
	send, err := replication.ListenTCP(replication.TCPConfig{Bind: "127.0.0.1:0", Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	defer send.Close()
	ctx := context.Background()
	if err := send.Send(ctx, 2, []byte("x")); err == nil {
		t.Fatal("a send to a node with no address succeeded")
	}
	send.SetAddr(2, recv.Addr())
	if err := send.Send(ctx, 2, bytes.Repeat([]byte("o"), 2<<10)); err != nil {
		t.Fatal(err) // written; the receiver refuses it
	}
	// Frames sent before the sender notices the closed connection are lost
	// (raft retransmits); keep sending numbered frames until some arrive.
	deadline := time.Now().Add(10 * time.Second)
	for i := byte(0); ; i++ {
		_ = send.Send(ctx, 2, []byte{'f', i})
		time.Sleep(5 * time.Millisecond)
		mu.Lock()
		n := len(got)
		mu.Unlock()
		if n >= 3 {
			break
		}
		if time.Now().After(deadline) || i == 255 {
			t.Fatalf("%d frames arrived after the oversize one", n)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	for k, f := range got {
		if len(f) != 2 || f[0] != 'f' || (k > 0 && f[1] <= got[k-1][1]) {
			t.Fatalf("frame %d: %d bytes %q... (an oversize frame was handed over, or frames out of order)", k, len(f), f[:min(len(f), 8)])
		}
	}
}
