// Command holdfast runs a Holdfast node (`holdfast serve`), operates a cluster
// (`holdfast cluster ...`) and talks to a node as a client (`holdfast object`,
// `log`, `queue`, `alarm`, `token`, `export`, `import`). One file per command
// group.
//
// # The server
//
//   - serve.go: `holdfast serve`. Reads the configuration (config.Load: the
//     YAML file, then the environment variables over it; then the command's
//     flags over both), opens the node (a single node, or a cluster member
//     when the configuration has a cluster section; `--dev-cluster` starts an
//     embedded etcd for a trial), the cold store (cold/fs or cold/s3), and the
//     gateway behind one listener (fasthttp for the hot routes, net/http for
//     the rest: docs/decisions.md, "Two HTTP servers behind one port").
//     SIGTERM lets the writes in flight finish and, in a cluster, hands the
//     node's partitions off before it exits 0. It raises the descriptor limit
//     and caps connections below it (connectionCap), and refuses a binary
//     built with a planted bug (refusePlantedBug).
//   - memlimit.go: GOMEMLIMIT from the node's memory budget unless the
//     environment sets it.
//   - repair.go: `holdfast repair wal`, the only way past a corrupt write-ahead
//     log (it reports, and cuts the log at the damage only with
//     --accept-data-loss).
//   - app.go: `holdfast app show`, the apps a node serves and their keys,
//     read from the node's files.
//   - version.go: `holdfast version`, from the build's module information.
//
// # Operating a cluster
//
//   - clustercmd.go: `holdfast cluster status` (summary; `--partitions` for each
//     partition's replicas, leader, term and lag), `leave` (the node hands its
//     partitions off and exits, as on SIGTERM), `forget-node` and
//     `recover-partition` (both lose data, so both want --accept-data-loss).
//     They talk to the cluster's etcd (package cluster's admin functions),
//     not to a node, which may be the one that is down.
//
// # The client
//
// Every client command goes through the Go client library (package client,
// imported as hfclient); these files only parse arguments and print.
//
//   - client.go: the shared flags (--url, --app-key, --app-secret, --context,
//     --json), the client, and the server's errors (spec/errors.md), printed
//     as JSON with --json.
//   - context.go: `holdfast context`, saved URLs and keys
//     ($XDG_CONFIG_HOME/holdfast/contexts.json).
//   - client_object.go, client_log.go, client_queue.go, client_alarm.go,
//     client_token.go, client_list.go: one file per kind of object.
//   - client_watch.go: `holdfast object watch`, the live feed, resumed from
//     the last log_id after a lost connection.
//   - client_export.go, client_import.go, client_progress.go: JSON-lines export
//     and import (import sends batches: spec/batch.md), with a progress bar on a
//     terminal once a transfer is long.
//
// # Tests
//
// The tests run the real binary: TestMain (crash_test.go) turns the test binary
// into `holdfast` when HOLDFAST_TEST_MAIN=1 and into an etcd process when
// HOLDFAST_TEST_ETCD is set, so every process-level test starts real server
// processes and kills them with SIGKILL.
//
//   - crash_test.go, log_crash_test.go, queue_crash_test.go,
//     lease_crash_test.go, alarm_crash_test.go, cold_crash_test.go: a single
//     node killed under load; every acknowledged write must be there after
//     each restart. target_test.go lets the same workloads run against a
//     cluster (cluster_crash_test.go).
//   - cluster_crash_test.go, cluster_identity_test.go, cluster_status_test.go:
//     clusters of one copy per partition (kills, a node cut off from etcd, a
//     reused nodeId on an empty disk, status and leave).
//   - cluster_replicated_test.go (3 processes) and cluster_replicated5_test.go
//     (5): replicated clusters under load through the faults issue 27 names
//     (a leader's kill, a follower's, two of five, a wiped disk, a raft link
//     cut through internal/tcpproxy, a leave and a join, a node down past
//     replaceAfter). Each checks every acknowledged write, gap-free log_ids
//     and one server per object at a time (the served-by header's epochs).
//     cluster_recover_test.go: recover-partition.
//   - The rest test one command or one behaviour of serve each.
//
// The long tests skip under -short; README.md's test command runs them all.
package main
