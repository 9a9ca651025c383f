package gateway

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package if a test leaves a goroutine behind: the
// websockets' goroutines are owned by their Server, which Close waits for.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
