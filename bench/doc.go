// Command bench measures Holdfast against a raw fsync probe and against its
// peers, Redis and NATS JetStream, side by side in one run.
//
//	go run ./bench                  # 5 rounds, 3s per case, every system
//	go run ./bench -smoke           # the CI profile: 2 rounds of 1s, fails only far below a target
//	go run ./bench -cases 1000-objects -systems holdfast,redis -rounds 7
//	go run ./bench -json bench/results/run.json -md bench/results/run.md
//
// The systems: Holdfast embedded (its Go API), Holdfast over HTTP (a node and
// its gateway in a child process), Holdfast's in-cluster Go client (a client
// member in the case's process, a node and an embedded etcd in a child
// process; increments-256 only), Redis (Debian's redis-server, appendonly
// yes, appendfsync always; see bench/peers) and JetStream (embedded, file
// store, SyncAlways). Every record is 256 bytes and every write is synced
// before it is acknowledged.
//
// Each round runs the probe, then every (system, workload) case in a shuffled
// order, then the probe again; each case runs in its own process with a fresh
// data directory, an unmeasured warm-up first. The probe is a 4 KiB overwrite
// plus fdatasync in a pre-written file; a case's ratio is its throughput over
// the mean of its round's two probes, and Holdfast's ratio to a peer is taken
// within each round. The report gives the median and the spread (min-max) of
// each figure over the rounds, the costs per operation (CPU, disk bytes per
// payload byte), restart with -log-records records, and Holdfast's memory per
// object.
//
// The replicated peers of issue 27 run only when -systems names them, and only
// the one-writer and 1000-objects cases: etcd3 (three member processes of the
// etcd binary built from the module cache, cached in ~/.cache/holdfast-test-bin),
// etcd1 (one member, for reference) and jetstream-r3 (three embedded servers,
// streams with three replicas); and Holdfast replicated, holdfast-r3 (three
// nodes with replicationFactor 3 and an embedded etcd in the case's process,
// each write sent to a random node; with HOLDFAST_BENCH_R3_ROUTE=leader, to
// the node that served the caller's object last, as a leader-aware client
// would; HOLDFAST_BENCH_R3_PARTITIONS=N gives its cluster N partitions instead
// of the default 256, for experiments: fewer, busier raft groups batch more
// writes per message; the case's note gives the raft messages the nodes sent
// each other per write). The report adds a table with each
// operation's latency (p50, p99) and Holdfast R3's ratio to each peer:
//
//	go run ./bench -systems holdfast,holdfast-r3,etcd3,jetstream-r3 -cases 1000-objects,one-writer -rounds 3
//
// The wire cases of issue 28 run on Holdfast over HTTP and Redis only:
// increments-256 (256 callers each incrementing one of 1,000 objects, one
// request at a time; Redis INCR) and batch-increments-16x100 (16 clients each
// sending 100 increments at once: one POST /api/v1/batch, or one Redis
// pipeline of 100 INCRs). Their targets are on the REST figure:
//
//	go run ./bench -systems holdfast,holdfast-http,redis -cases increments-256,batch-increments-16x100 -rounds 3
//
// increments-256 also runs on holdfast-client (issue 28 point 3): a Go
// service that joins the cluster as a client (cluster.StartClient) and sends
// each increment over the node-to-node transport to the one node, which owns
// every partition. Its target, 1x Redis, is on that figure; the node's CPU
// (etcd's included) is given apart from the client's:
//
//	go run ./bench -systems holdfast-client,redis -cases increments-256 -rounds 3
//
// Other modes: -fanout (websocket fan-out), -cold (cold storage), -alarms,
// -cluster, -stall (write latency with storage maintenance, issue 25), and
// -replicated (issue 27: three `holdfast serve` processes built from
// ./cmd/holdfast, replicationFactor 3, and an etcd embedded in the driver):
// failover over -replicated-kills kills -9 of the node leading the most
// partitions (per object it led, the time until another node acknowledged a
// write of it), and catch-up of a node restarted on an empty data directory
// after -replicated-mib MiB of KV data (seconds per GiB until every
// partition has three live replicas again):
//
//	go run ./bench -replicated -md replicated.md   # 10 kills, 1 GiB, 256 partitions: about 10 minutes
//
// One case alone, profiled over its measured interval (a fresh -dir each time):
//
//	HOLDFAST_BENCH_CPUPROFILE=cpu.prof go run ./bench -case holdfast/1000-objects -dir /tmp/k -duration 5s
//
// In a holdfast-http or holdfast-client case the profile is the server
// child's (the case's process is the client); in -cluster's latency phase,
// the other-64 case's (64 writers through a node that does not own their
// objects).
//
// HOLDFAST_BENCH_ALLOCPROFILE writes a heap profile (go tool pprof
// -sample_index=alloc_space; a holdfast-http case's is the server child's)
// and HOLDFAST_BENCH_TRACE an execution trace.
// HOLDFAST_BENCH_HTTP_CLUSTER=1 makes a holdfast-http case's server a
// cluster's one member (replicationFactor 1, an embedded etcd) instead of a
// single node, for the cluster member's request path.
// A holdfast-http case's server is served as holdfast serve serves it,
// through the gateway's Front (fasthttp for the hot KV routes, net/http for
// the rest); HOLDFAST_BENCH_NETHTTP=1 serves it on net/http alone, as before
// the Front, for a comparison. The holdfast-http cases' clients (and the
// floor's) are net/http's keep-alive client; HOLDFAST_BENCH_HTTP_CLIENT=fasthttp
// makes them fasthttp's HostClient, which spends about what go-redis spends
// per request, so that the ratio to Redis compares the servers rather than
// the clients (both share the machine's cores):
//
//	HOLDFAST_BENCH_HTTP_CLIENT=fasthttp go run ./bench -systems holdfast-http,redis -cases increments-256,hot-object-64-callers -rounds 5
//
// The HTTP floor (-http-floor, httpfloor.go) runs bare net/http and fasthttp
// servers answering a fixed reply beside holdfast-http and Redis on
// increments-256: what the HTTP server costs before Holdfast does anything.
package main
