package holdfast_test

import (
	"testing"

	"github.com/holdfast/holdfast/internal/leakcheck"
)

// TestMain fails the package if a test leaves a goroutine behind: a Runtime's Close waits for every goroutine of its node.
func TestMain(m *testing.M) {
	leakcheck.Main(m)
}
