package peers

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// JetStreamCluster is a cluster of NATS servers with JetStream, all embedded
// in this process, routed to each other over TCP on 127.0.0.1, each with its
// own file store and SyncAlways: a stream with Replicas: n keeps a raft log
// on every server, each server fsyncs it on every append, and a publish is
// acknowledged once a majority stored it. The servers share this process
// (and its Go runtime) with the client: CPU and disk figures cover all of
// them together.
type JetStreamCluster struct {
	dir     string
	size    int // servers, as started
	servers []*server.Server
	nc      *nats.Conn
	js      jetstream.JetStream
}

var _ Peer = (*JetStreamCluster)(nil)

// JetStreamClusterTimeout bounds how long the cluster may take to elect its
// meta leader, and a new stream its leader, after the servers started.
var JetStreamClusterTimeout = 30 * time.Second

// StartJetStreamCluster starts n embedded servers with their stores under dir
// (dir/n0, dir/n1...), routes between them, and connects a client to the
// first. It returns once every server accepts connections; streams wait for
// the cluster's JetStream (see stream).
func StartJetStreamCluster(dir string, n int) (*JetStreamCluster, error) {
	if n < 1 {
		return nil, fmt.Errorf("peers: jetstream cluster of %d servers", n)
	}
	dir, err := filepath.Abs(dir)
	if err != nil {
		return nil, fmt.Errorf("peers: jetstream dir: %w", err)
	}
	// The route ports are picked free before the servers bind them; a start
	// that lost one to another process is tried again on fresh ports.
	var lastErr error
	for attempt := range 3 {
		c := &JetStreamCluster{dir: filepath.Join(dir, fmt.Sprintf("try%d", attempt)), size: n}
		if err := c.start(n); err != nil {
			lastErr = err
			_ = os.RemoveAll(c.dir)
			slog.Debug("jetstream cluster did not start", "attempt", attempt, "err", err)
			continue
		}
		return c, nil
	}
	return nil, lastErr
}

func (c *JetStreamCluster) start(n int) error {
	routePorts := make([]int, n)
	var routes []*url.URL
	for i := range routePorts {
		p, err := freePort()
		if err != nil {
			return err
		}
		routePorts[i] = p
		routes = append(routes, &url.URL{Scheme: "nats-route", Host: "127.0.0.1:" + strconv.Itoa(p)})
	}
	for i := range n {
		store := filepath.Join(c.dir, "n"+strconv.Itoa(i))
		if err := os.MkdirAll(store, 0o755); err != nil {
			return fmt.Errorf("peers: jetstream dir: %w", err)
		}
		opts := &server.Options{
			ServerName:             "holdfast-bench-n" + strconv.Itoa(i),
			Host:                   "127.0.0.1",
			Port:                   server.RANDOM_PORT,
			Cluster:                server.ClusterOpts{Name: "holdfast-bench", Host: "127.0.0.1", Port: routePorts[i]},
			Routes:                 routes,
			JetStream:              true,
			StoreDir:               store,
			SyncAlways:             true,
			NoLog:                  true,
			NoSigs:                 true,
			DisableJetStreamBanner: true,
		}
		srv, err := server.NewServer(opts)
		if err != nil {
			c.shutdown()
			return fmt.Errorf("peers: new nats server %d: %w", i, err)
		}
		c.servers = append(c.servers, srv)
	}
	// A clustered server's Start waits for its routes' JetStream; the
	// servers start together, and this function waits for every Start.
	var wg sync.WaitGroup
	for _, srv := range c.servers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			srv.Start()
		}()
	}
	wg.Wait()
	for i, srv := range c.servers {
		if !srv.ReadyForConnections(StartTimeout) {
			c.shutdown()
			return fmt.Errorf("peers: nats server %d (routes on 127.0.0.1:%d) not ready after %v", i, routePorts[i], StartTimeout)
		}
	}
	urls := make([]string, n)
	for i, srv := range c.servers {
		urls[i] = srv.ClientURL()
	}
	nc, err := nats.Connect(strings.Join(urls, ","), nats.Name("holdfast-bench"), nats.DontRandomize(), nats.Timeout(StartTimeout))
	if err != nil {
		c.shutdown()
		return fmt.Errorf("peers: connect to nats cluster: %w", err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		c.shutdown()
		return fmt.Errorf("peers: jetstream client: %w", err)
	}
	c.nc, c.js = nc, js
	return nil
}

// shutdown shuts every server down and waits for each, at most StopTimeout.
func (c *JetStreamCluster) shutdown() error {
	var errs []error
	for _, srv := range c.servers {
		srv.Shutdown()
	}
	for i, srv := range c.servers {
		if !waitShutdown(srv) {
			errs = append(errs, fmt.Errorf("peers: nats server %d did not shut down within %v", i, StopTimeout))
		}
	}
	c.servers = nil
	return errors.Join(errs...)
}

// Close closes the client and shuts every server down.
func (c *JetStreamCluster) Close() error {
	if c.nc != nil {
		c.nc.Close()
		c.nc = nil
	}
	return c.shutdown()
}

// Name returns "jetstream-r3" for three servers ("jetstream-r<n>").
func (c *JetStreamCluster) Name() string { return "jetstream-r" + strconv.Itoa(c.size) }

// PID returns this process's id: the servers are embedded.
func (c *JetStreamCluster) PID() int { return os.Getpid() }

// Servers returns the running servers.
func (c *JetStreamCluster) Servers() []*server.Server {
	return append([]*server.Server(nil), c.servers...)
}

// JetStream returns the client's JetStream context.
func (c *JetStreamCluster) JetStream() jetstream.JetStream { return c.js }

// stream creates the stream cfg (file storage, one replica per server) and
// waits until it has a leader and every replica is current. Creating a
// stream fails until the cluster has elected its meta leader, so it is tried
// again until JetStreamClusterTimeout.
func (c *JetStreamCluster) stream(cfg jetstream.StreamConfig) (jetstream.Stream, error) {
	cfg.Storage = jetstream.FileStorage
	cfg.Replicas = c.size
	deadline := time.Now().Add(JetStreamClusterTimeout)
	var lastErr error
	for time.Now().Before(deadline) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		s, err := c.js.CreateOrUpdateStream(ctx, cfg)
		if err == nil {
			var info *jetstream.StreamInfo
			if info, err = s.Info(ctx); err == nil {
				err = replicasCurrent(info, c.size)
			}
		}
		cancel()
		if err == nil {
			return s, nil
		}
		lastErr = err
		time.Sleep(50 * time.Millisecond)
	}
	return nil, fmt.Errorf("peers: jetstream stream %s with %d replicas not ready within %v: %w", cfg.Name, cfg.Replicas, JetStreamClusterTimeout, lastErr)
}

// replicasCurrent says why the stream is not yet served by a leader and
// replicas-1 current followers, or nil.
func replicasCurrent(info *jetstream.StreamInfo, replicas int) error {
	if info.Cluster == nil || info.Cluster.Leader == "" {
		return errors.New("no stream leader yet")
	}
	if len(info.Cluster.Replicas) != replicas-1 {
		return fmt.Errorf("%d followers, want %d", len(info.Cluster.Replicas), replicas-1)
	}
	for _, p := range info.Cluster.Replicas {
		if !p.Current {
			return fmt.Errorf("follower %s not current", p.Name)
		}
	}
	return nil
}

// jetStreamClusterNote is the note of the cluster's results; its parts are
// separated by "; " (the report splits notes there).
const jetStreamClusterNote = "JetStream R%d: %d servers embedded in the case's process, routed over 127.0.0.1, file store with SyncAlways: every server fsyncs the stream's raft log on each append, and a publish is acknowledged once a majority stored it; the client connects to the first server, which may not lead the stream; ClientCPU and DiskBytes cover the client and all servers together"

// Writes runs callers goroutines, caller c publishing the payload to
// obj.<c mod objects> on the stream OBJ (subjects obj.>, one message kept
// per subject, Replicas: the cluster's size) and waiting for the ack, one
// publish in flight each.
func (c *JetStreamCluster) Writes(objects, callers int, d time.Duration) (Result, error) {
	if err := checkCounts("jetstream cluster writes", objects, callers); err != nil {
		return Result{}, err
	}
	return c.publishes(jetstream.StreamConfig{Name: "OBJ", Subjects: []string{"obj.>"}, MaxMsgsPerSubject: 1}, "obj.", objects, callers, d)
}

// KVWrites is Writes on the stream KV (subjects kv.>): callers goroutines
// publishing to kv.<c mod keys>, as a key-value bucket of history 1 stores
// its puts.
func (c *JetStreamCluster) KVWrites(callers, keys int, d time.Duration) (Result, error) {
	if err := checkCounts("jetstream cluster kv writes", callers, keys); err != nil {
		return Result{}, err
	}
	return c.publishes(jetstream.StreamConfig{Name: "KV", Subjects: []string{"kv.>"}, MaxMsgsPerSubject: 1}, "kv.", keys, callers, d)
}

func (c *JetStreamCluster) publishes(cfg jetstream.StreamConfig, prefix string, keys, callers int, d time.Duration) (Result, error) {
	if _, err := c.stream(cfg); err != nil {
		return Result{}, err
	}
	subjects := keyNames(prefix, callers, keys)
	m, err := run(callers, d, c.PID(), func(ctx context.Context, w int) (int64, error) {
		ctx, cancel := context.WithTimeout(ctx, OpTimeout)
		defer cancel()
		if _, err := c.js.Publish(ctx, subjects[w], payload); err != nil {
			return 0, fmt.Errorf("publish %s: %w", subjects[w], err)
		}
		return 1, nil
	})
	if err != nil {
		return Result{}, fmt.Errorf("peers: %s writes (%d subjects, %d callers): %w", c.Name(), keys, callers, err)
	}
	m.Note = joinNotes(fmt.Sprintf(jetStreamClusterNote, c.size, c.size), m.Note)
	return m.Result, nil
}

// StreamAdds is not measured on the cluster.
func (c *JetStreamCluster) StreamAdds(int, time.Duration) (Result, error) {
	return Result{}, errNotMeasured(c.Name(), "stream adds")
}

// Batches is not measured on the cluster.
func (c *JetStreamCluster) Batches(int, time.Duration) (Result, error) {
	return Result{}, errNotMeasured(c.Name(), "batches")
}

// LeaseCycles is not measured on the cluster.
func (c *JetStreamCluster) LeaseCycles(int, time.Duration) (Result, error) {
	return Result{}, errNotMeasured(c.Name(), "lease cycles")
}

// FillAndRestart is not measured on the cluster.
func (c *JetStreamCluster) FillAndRestart(int) (float64, error) {
	return 0, errNotMeasured(c.Name(), "restart")
}

// Restart is not measured on the cluster.
func (c *JetStreamCluster) Restart() (time.Duration, error) {
	return 0, errNotMeasured(c.Name(), "restart")
}
