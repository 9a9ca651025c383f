package cluster

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/holdfast/holdfast/internal/leakcheck"
)

// TestMain fails the package if a test leaves a goroutine behind. The only
// ones ignored are protoactor-go's throttles (of gossip, two per member, and of
// dead letters, one per actor system that had one): the library starts one
// goroutine per throttle and never stops it (TRAPS.md). They are
// named by their exact top function; everything else, including every etcd and
// gRPC goroutine, must end (the etcd provider's own client is closed by us:
// closeProviderClient).
func TestMain(m *testing.M) {
	leakcheck.Main(m,
		goleak.IgnoreTopFunction("github.com/asynkron/protoactor-go/cluster.(*Gossiper).StartGossiping.NewThrottle.func3.1"),
		goleak.IgnoreTopFunction("github.com/asynkron/protoactor-go/cluster.NewGossipActor.NewThrottleWithLogger.func2.1"),
		goleak.IgnoreTopFunction("github.com/asynkron/protoactor-go/actor.NewDeadLetter.NewThrottle.func4.1"),
	)
}
