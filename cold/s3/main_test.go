package s3

import (
	"testing"

	"github.com/holdfast/holdfast/internal/leakcheck"
)

// TestMain fails the package if a test leaves a goroutine behind: every store call returns, and the S3 client keeps no
// goroutine of its own beyond the test (idle connections close).
func TestMain(m *testing.M) {
	leakcheck.Main(m)
}
