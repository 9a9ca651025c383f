package actors

import (
	"testing"

	"github.com/holdfast/holdfast/internal/leakcheck"
)

// TestMain fails the package if a test leaves a goroutine behind: every
// goroutine of a Host has an owner that Close stops and waits for.
func TestMain(m *testing.M) {
	leakcheck.Main(m)
}
