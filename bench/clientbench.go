package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/holdfast/holdfast/actors"
	"github.com/holdfast/holdfast/cluster"
	"github.com/holdfast/holdfast/internal/devetcd"
)

// The system "holdfast-client" (issue 28 point 3): a Go service that joins
// the cluster as a client member (cluster.StartClient) in the case's process
// and sends its objects' messages over the node-to-node transport on
// 127.0.0.1. The cluster is one node and an embedded etcd in a child process
// (as holdfast-http's node is), with the HTTP child's partitions and type
// options and replicationFactor 1; the node owns every partition, so every
// request takes one hop, client to owner, and no gateway is involved.

const sysHoldfastClient = "holdfast-client"

// clientClusterName is the cluster's name in the child's etcd.
const clientClusterName = "bench"

// clientNote is what the case's figures mean; the report splits notes at "; ".
const clientNote = "a client member (cluster.StartClient) in the case's process, its requests over the node-to-node transport on 127.0.0.1; " +
	"one node owning every partition and an embedded etcd in a child process (the server's CPU: both)"

// clientServerInfo is what a holdfast-client case's server child prints once
// its node owns every partition.
type clientServerInfo struct {
	Endpoint string `json:"endpoint"` // etcd's client endpoint
}

// clientServer is the child process of a holdfast-client case: an embedded
// etcd and node a, which serves until stdin closes.
func clientServer(dir string) int {
	if err := serveClusterNode(dir); err != nil {
		fmt.Fprintln(os.Stderr, "bench: client-server:", err)
		return 1
	}
	return 0
}

func serveClusterNode(dir string) error {
	// As holdfast serve does, once for the node's process.
	cluster.TuneGOMAXPROCS(nil)
	_, e, stop, err := startClusterMember(dir, func(string) actors.TypeOptions { return defaultTypeOptions() })
	if err != nil {
		return err
	}
	defer stop()
	// HOLDFAST_BENCH_CPUPROFILE profiles this server child (its warm-up and
	// set-up included), as in a holdfast-http case.
	stopProfile := profileCPU()
	defer stopProfile()
	if err := json.NewEncoder(os.Stdout).Encode(clientServerInfo{Endpoint: e.Endpoint()}); err != nil {
		return err
	}
	_, _ = bufio.NewReader(os.Stdin).ReadString('\n') // until the case closes stdin
	return nil
}

// startClusterMember starts a cluster's one member "a" (replicationFactor 1)
// and an embedded etcd under dir, and waits until it owns every partition;
// stop closes both.
func startClusterMember(dir string, typeOptions func(string) actors.TypeOptions) (node *cluster.Node, e *devetcd.Server, stop func(), err error) {
	if e, err = devetcd.Start(devetcd.Config{Dir: filepath.Join(dir, "etcd")}); err != nil {
		return nil, nil, nil, fmt.Errorf("start etcd: %w", err)
	}
	node, err = cluster.Start(cluster.Config{
		DataDir: filepath.Join(dir, "a"), Logger: quietLogger(), TypeOptions: typeOptions,
		Cluster: &cluster.ClusterConfig{Name: clientClusterName, NodeID: "a", Advertise: "127.0.0.1:0", Endpoints: []string{e.Endpoint()}, ReplicationFactor: 1},
	})
	if err != nil {
		e.Close()
		return nil, nil, nil, fmt.Errorf("start node a: %w", err)
	}
	stop = func() {
		_ = node.Close(context.Background())
		e.Close()
	}
	if err := waitOwnsAll(e.Endpoint(), "a", time.Minute); err != nil {
		stop()
		return nil, nil, nil, err
	}
	return node, e, stop, nil
}

// waitOwnsAll polls the cluster's status every 20 ms, at most timeout, until
// node owns every partition and each is available and not moving.
func waitOwnsAll(endpoint, node string, timeout time.Duration) error {
	why := "no status read yet"
	for deadline := time.Now().Add(timeout); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		st, err := cluster.ReadStatus(context.Background(), []string{endpoint}, clientClusterName)
		if err != nil {
			why = err.Error()
			continue
		}
		owned := 0
		for _, p := range st.Parts {
			if p.Owner == node {
				owned++
			}
		}
		if owned == st.Partitions && settled(st, "") {
			return nil
		}
		why = fmt.Sprintf("%d of %d partitions owned by %s", owned, st.Partitions, node)
	}
	return fmt.Errorf("node %s did not own every partition within %v: %s", node, timeout, why)
}

// clientSpec is a workload's form through an in-cluster Go client.
type clientSpec struct {
	workers int
	// setup prepares the objects (activated) through r and returns the
	// operation of worker w.
	setup func(r actors.Requester) (func(w int) (int64, error), error)
}

// clientIncrements: worker w increments slot n of object w mod objects, one
// request at a time, as the embedded form (increments) does.
func clientIncrements(objects, callers int) *clientSpec {
	return &clientSpec{workers: callers, setup: func(r actors.Requester) (func(int) (int64, error), error) {
		ctx := context.Background()
		kvs := make([]*actors.KV, objects)
		for i := range kvs {
			kvs[i] = actors.NewKV(r, actors.ObjectID{App: "app_bench", Type: "bench", Key: fmt.Sprintf("obj-%d", i)})
		}
		err := inParallel(objects, func(i int) error { // every object active before measuring
			_, err := kvs[i].Increment(ctx, "n", 1)
			return err
		})
		if err != nil {
			return nil, fmt.Errorf("activate: %w", err)
		}
		return func(w int) (int64, error) {
			_, err := kvs[w%objects].Increment(ctx, "n", 1)
			return 1, err
		}, nil
	}}
}

// clientCase runs workload w through an in-cluster Go client, against a node
// in a server child: warm-up, measured interval, and the child's CPU and disk
// bytes (serverLoop).
func clientCase(w workload, dir string, d, warmup time.Duration) (result, error) {
	if w.client == nil {
		return result{}, fmt.Errorf("%s has no in-cluster client form", w.name)
	}
	var info clientServerInfo
	srv, err := startServerChild(&info, "-case", "client-server", "-dir", filepath.Join(dir, "data"))
	if err != nil {
		return result{}, err
	}
	defer srv.close()
	c, err := cluster.StartClient(cluster.ClientConfig{Name: clientClusterName, ID: "bench-client", Advertise: "127.0.0.1:0",
		Endpoints: []string{info.Endpoint}, Logger: quietLogger()})
	if err != nil {
		return result{}, fmt.Errorf("start the client: %w", err)
	}
	defer c.Close() // before the child's etcd goes
	op, err := w.client.setup(c)
	if err != nil {
		return result{}, err
	}
	r, err := serverLoop(srv, w.client.workers, warmup, d, op)
	if err != nil {
		return result{}, err
	}
	if !w.payload {
		r.PayloadBytes = 0
	}
	r.Note = strings.TrimPrefix(r.Note+"; "+clientNote, "; ")
	return r, nil
}
