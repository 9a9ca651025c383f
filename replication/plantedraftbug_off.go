//go:build !plantedraftbug

package replication

import (
	"errors"

	"go.etcd.io/raft/v3/raftpb"
)

// PlantedRaftBug says whether this binary was built with the plantedraftbug
// tag: a leader that acknowledges a write once its own fsync of the entry is
// done, without waiting for a majority (plantedraftbug_on.go), for the
// torture tool's own test. It is false in every real build, and `holdfast
// serve` refuses to run a binary where it is true unless told it is a test.
const PlantedRaftBug = false

// errPlantedAck is never returned without the tag.
var errPlantedAck = errors.New("replication: plantedraftbug: not built in")

// plantedAckAppended does nothing without the tag.
func (g *group) plantedAckAppended(*raftpb.Message) {}
