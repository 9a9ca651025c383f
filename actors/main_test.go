package actors

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package if a test leaves a goroutine behind: every
// goroutine of a Host has an owner that Close stops and waits for.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
