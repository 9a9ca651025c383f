package alarms

import (
	"testing"

	"github.com/holdfast/holdfast/internal/leakcheck"
)

// TestMain fails the package if a test leaves a goroutine behind: the scheduler's Close waits for its loop and workers.
func TestMain(m *testing.M) {
	leakcheck.Main(m)
}
