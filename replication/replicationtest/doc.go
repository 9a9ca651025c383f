// Package replicationtest is the in-process test kit of package replication
// (issue 27, step 1): N engines x G groups in one process.
//
//   - MemDisk and MemPipeline (disk.go, pipeline.go): the fake storage
//     pipeline, one append goroutine that syncs every queued append job of all
//     groups as one batch, one apply goroutine; a crash loses what was not
//     synced, the disk keeps the rest. Step 2 replaces it with persistence's WAL.
//   - Network (network.go): seeded drops, duplicates, delays and reorders,
//     partitions, nodes taken down; every message copied through protobuf.
//   - Cluster and Checker (cluster.go, checker.go): start, crash (any set of
//     nodes at one instant), restart, partition and heal; every apply checked
//     against a model (see Checker for the invariants).
//
// model_test.go holds the rapid model test and the planted bugs it must catch.
// Goroutines: the network's delivery goroutine (Network.Start/Close), each
// pipeline's two (Start/Crash); Cluster.Close stops them all.
package replicationtest
