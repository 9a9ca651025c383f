package ownership

import (
	"testing"
	"time"
)

func TestChecker(t *testing.T) {
	t0 := time.Now()
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	c := New()
	if err := c.Record("a", 1, 1, at(0), at(10)); err != nil {
		t.Fatal(err)
	}
	if err := c.Record("a", 1, 1, at(50), at(60)); err != nil {
		t.Fatal(err)
	}
	if err := c.Record("b", 1, 1, at(70), at(80)); err == nil {
		t.Fatal("two nodes under one epoch went unnoticed")
	}
	// b at epoch 2, strictly after a's last proven moment: fine.
	if err := c.Record("b", 1, 2, at(100), at(110)); err != nil {
		t.Fatal(err)
	}
	if err := c.Verify(); err != nil {
		t.Fatal(err)
	}
	// a again at epoch 1, after b had started at epoch 2: overlap.
	if err := c.Record("a", 1, 1, at(120), at(130)); err != nil {
		t.Fatal(err)
	}
	if err := c.Verify(); err == nil {
		t.Fatal("overlapping serving periods went unnoticed")
	}
	if c.Periods() != 2 {
		t.Fatalf("periods = %d", c.Periods())
	}
}
