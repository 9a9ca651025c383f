package gateway

import (
	"testing"

	"github.com/holdfast/holdfast/internal/leakcheck"
)

// TestMain fails the package if a test leaves a goroutine behind: the
// websockets' goroutines are owned by their Server, which Close waits for.
func TestMain(m *testing.M) {
	leakcheck.Main(m)
}
