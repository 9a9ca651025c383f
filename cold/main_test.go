package cold_test

import (
	"testing"

	"github.com/holdfast/holdfast/internal/leakcheck"
)

// TestMain fails the package if a test leaves a goroutine behind: every store call returns before the test ends.
func TestMain(m *testing.M) {
	leakcheck.Main(m)
}
