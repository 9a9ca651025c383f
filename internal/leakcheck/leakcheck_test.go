package leakcheck

import (
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { Main(m) }

func TestFind_SeesAGoroutineUntilItEnds(t *testing.T) {
	stop := make(chan struct{})
	go func() { <-stop }()
	if err := goleak.Find(); err == nil {
		t.Fatal("Find saw no goroutine while one was running")
	}
	close(stop)
	if err := find(nil); err != nil {
		t.Fatalf("find after the goroutine ended: %v", err)
	}
}
