package cluster

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/holdfast/holdfast/internal/leakcheck"
)

// TestMain fails the package if a test leaves a goroutine behind. The only one
// ignored is protoactor-go's dead-letter throttle (one per actor system that
// had a dead letter: the library starts it and never stops it, TRAPS.md); a
// node's actors run in a protoactor-go actor system. Everything else, every
// etcd and gRPC goroutine and every one of the transport's, must end.
func TestMain(m *testing.M) {
	leakcheck.Main(m,
		goleak.IgnoreTopFunction("github.com/asynkron/protoactor-go/actor.NewDeadLetter.NewThrottle.func4.1"),
	)
}
