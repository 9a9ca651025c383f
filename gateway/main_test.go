package gateway

import (
	"testing"

	"github.com/holdfast/holdfast/internal/leakcheck"
	"go.uber.org/goleak"
)

// TestMain fails the package if a test leaves a goroutine behind: the
// websockets' goroutines are owned by their Server, which Close waits for.
// fasthttp keeps one goroutine for the whole process, started with its first
// server, that refreshes the Date header once a second; it is not ours to stop.
func TestMain(m *testing.M) {
	leakcheck.Main(m, goleak.IgnoreAnyFunction("github.com/valyala/fasthttp.updateServerDate.func1"))
}
