package goroutine

import "testing"

func TestID_DiffersBetweenGoroutinesAndStaysPut(t *testing.T) {
	me := ID()
	if me <= 0 || ID() != me {
		t.Fatalf("ID() = %d, then %d", me, ID())
	}
	other := make(chan int64)
	go func() { other <- ID() }()
	if o := <-other; o == me || o <= 0 {
		t.Fatalf("another goroutine's ID %d, mine %d", o, me)
	}
}
