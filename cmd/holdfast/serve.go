package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/net/netutil"

	"github.com/holdfast/holdfast/actors"
	"github.com/holdfast/holdfast/cluster"
	"github.com/holdfast/holdfast/cold"
	coldfs "github.com/holdfast/holdfast/cold/fs"
	colds3 "github.com/holdfast/holdfast/cold/s3"
	"github.com/holdfast/holdfast/config"
	"github.com/holdfast/holdfast/gateway"
	"github.com/holdfast/holdfast/internal/devetcd"
	"github.com/holdfast/holdfast/metrics"
	"github.com/holdfast/holdfast/replication"
)

func serveCommand() *cobra.Command {
	var (
		configFile  string
		dataDir     string
		listen      string
		partitions  int
		idleTimeout time.Duration
		maxConns    int
		devCluster  bool
		devEtcdPort int
		logFormat   string
		logLevel    string
	)
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Run a Holdfast node with the REST API",
		Long: `Run a single Holdfast node. Configuration comes from --config FILE, then HOLDFAST_*
environment variables, then flags; with none of them it serves ./holdfast-data on
127.0.0.1:7070 and creates an app on first start.

With a cluster section in the configuration the node joins that cluster through
etcd. --dev-cluster instead starts an embedded single-member etcd in the data
directory and runs this node as a cluster of one, for trials and tests; it
prints the etcd endpoint, on --dev-etcd-port if given, so that other nodes can
join it (docs/cluster.md).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := config.Load(configFile, os.Getenv)
			if err != nil {
				return err
			}
			f := cmd.Flags()
			if f.Changed("data-dir") {
				cfg.DataDir = dataDir
			}
			if f.Changed("listen") {
				cfg.Listen = listen
			}
			if f.Changed("partitions") {
				cfg.Partitions = partitions
			}
			if f.Changed("idle-timeout") {
				cfg.IdleTimeout = idleTimeout
			}
			if f.Changed("max-connections") {
				cfg.MaxConnections = maxConns
			}
			if err := cfg.Validate(); err != nil {
				return err
			}
			log, err := newLogger(os.Stderr, logFormat, logLevel)
			if err != nil {
				return err
			}
			if f.Changed("dev-etcd-port") && !devCluster {
				return errors.New("--dev-etcd-port is the port of --dev-cluster's embedded etcd: add --dev-cluster, or name a real etcd in the configuration's cluster section")
			}
			if devEtcdPort < 0 || devEtcdPort > 65535 {
				return fmt.Errorf("--dev-etcd-port: want a port from 1 to 65535 (0: any free port), got %d", devEtcdPort)
			}
			if devCluster {
				if cfg.Cluster != nil {
					return errors.New("--dev-cluster runs its own etcd; remove the configuration's cluster section")
				}
				stop, err := startDevCluster(cfg, devEtcdPort, cmd.ErrOrStderr(), log)
				if err != nil {
					return err
				}
				defer stop()
			}
			return serve(cmd.Context(), cfg, log)
		},
	}
	f := cmd.Flags()
	f.StringVar(&configFile, "config", "", "YAML configuration file")
	f.StringVar(&dataDir, "data-dir", "", "data directory (default ./holdfast-data)")
	f.StringVar(&listen, "listen", "", "HTTP listen address (default 127.0.0.1:7070)")
	f.IntVar(&partitions, "partitions", 0, "partition count of a new data directory (default 256)")
	f.DurationVar(&idleTimeout, "idle-timeout", 0, "passivate objects idle this long (default 60s)")
	f.IntVar(&maxConns, "max-connections", 0, "HTTP connections open at once (default half the descriptor limit)")
	f.BoolVar(&devCluster, "dev-cluster", false, "run as a one-node cluster with an embedded etcd (trials and tests)")
	f.IntVar(&devEtcdPort, "dev-etcd-port", 0, "the embedded etcd's client port on 127.0.0.1, with --dev-cluster (default: any free port)")
	f.StringVar(&logFormat, "log-format", envOr("HOLDFAST_LOG_FORMAT", "text"), "log format: text or json (env HOLDFAST_LOG_FORMAT)")
	f.StringVar(&logLevel, "log-level", envOr("HOLDFAST_LOG_LEVEL", "info"), "log level: debug, info, warn or error (env HOLDFAST_LOG_LEVEL)")
	_ = cmd.RegisterFlagCompletionFunc("log-format", cobra.FixedCompletions([]string{"text", "json"}, cobra.ShellCompDirectiveNoFileComp))
	_ = cmd.RegisterFlagCompletionFunc("log-level", cobra.FixedCompletions([]string{"debug", "info", "warn", "error"}, cobra.ShellCompDirectiveNoFileComp))
	return cmd
}

// serve runs the node until SIGTERM or SIGINT, then stops accepting requests,
// lets in-flight ones finish (their writes become durable) and returns nil.
func serve(ctx context.Context, cfg *config.Config, log *slog.Logger) error {
	if err := refusePlantedBug(); err != nil {
		return err
	}
	cluster.TuneGOMAXPROCS(log)
	maxConns := connectionCap(cfg.MaxConnections, raiseFileLimit(log), log)
	configured := make([]gateway.App, 0, len(cfg.Apps))
	for _, a := range cfg.Apps {
		configured = append(configured, gateway.App{ID: a.ID, Key: a.Key, Secret: a.Secret})
	}
	apps, fromFile, created, err := gateway.LoadApps(cfg.DataDir, configured)
	if err != nil {
		return err
	}
	if fromFile {
		log.Info("the configuration lists no apps: serving those of the data directory", "apps", len(apps), "file", gateway.AppsFile(cfg.DataDir))
	}
	store, err := openColdStore(ctx, cfg)
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", cfg.Listen, err)
	}
	// net/http's own 431 (a header over its limit) goes out as JSON.
	ln = gateway.Listener(ln)
	// Past the cap a connection waits in the kernel's backlog, holding no
	// descriptor of ours, until one closes.
	ln = netutil.LimitListener(ln, maxConns)
	var cc *cluster.ClusterConfig
	if c := cfg.Cluster; c != nil {
		cc = &cluster.ClusterConfig{Name: c.Name, NodeID: c.NodeID, Advertise: c.Advertise, Bind: c.Bind, Endpoints: c.Etcd.Endpoints,
			LeaseTTL: c.LeaseTTL, HTTP: ln.Addr().String(), ReplicationFactor: c.ReplicationFactor, FailoverTimeout: c.FailoverTimeout, ReplaceAfter: c.ReplaceAfter,
			RaftAdvertise: c.RaftAdvertise, RaftBind: c.RaftBind}
	}
	mt := metrics.New()
	mt.BuildInfo(buildVersion())
	setMemoryLimit(cfg.MemoryBudget, log)
	node, err := cluster.Start(cluster.Config{
		DataDir:     filepath.Join(cfg.DataDir, "db"),
		Partitions:  cfg.Partitions,
		IdleTimeout: cfg.IdleTimeout,

		MemoryBudget: cfg.MemoryBudget, // setMemoryLimit derived Go's memory limit from it

		TypeOptions: func(typ string) actors.TypeOptions { return typeOptions(cfg.Type(typ)) },
		Logger:      log,
		Cold:        store,
		ColdShared:  coldShared(cfg),
		ColdUnused:  !cfg.FlushesCold(),
		Types:       goTypes,
		Cluster:     cc,
		Metrics:     mt,
	})
	if err != nil {
		ln.Close()
		return err
	}
	if created != nil {
		// Saved only now: a start that failed before this left no app behind.
		if err := gateway.SaveApps(cfg.DataDir, apps); err != nil {
			_ = node.Close(context.Background())
			ln.Close()
			return err
		}
		show := "holdfast app show"
		if filepath.Clean(cfg.DataDir) != filepath.Clean(config.Default().DataDir) {
			show += " --data-dir " + cfg.DataDir
		}
		fmt.Printf("Created an app on first start (kept in %s, readable only by this user; %s prints it again):\n"+
			"  App ID:     %s\n  App Key:    %s\n  App Secret: %s\n",
			gateway.AppsFile(cfg.DataDir), show, created.ID, created.Key, created.Secret)
	}
	gw := gateway.New(gateway.Config{Node: node, Apps: gateway.NewApps(apps), Logger: log,
		Metrics: mt, MetricsHandler: mt.Handler(), MaxBodyBytesInFlight: bodiesInFlight(cfg.MemoryBudget),
		ServedHeader: os.Getenv("HOLDFAST_TEST_SERVED_HEADER") == "1"})
	mt.GaugeFunc("holdfast_websocket_sockets", "Open websockets.", func() float64 { return float64(gw.Sockets()) })
	mt.GaugeFunc("holdfast_websocket_subscriptions", "Channels joined on the open websockets.", func() float64 { return float64(gw.Subscriptions()) })
	// The Front: fasthttp reads every request and serves the hot KV routes;
	// the rest goes to net/http (gateway/front.go).
	srv := gateway.NewFront(gw, newHTTPServer(log))
	log.Info("holdfast listening", "addr", ln.Addr().String(), "data_dir", cfg.DataDir, "partitions", node.Partitions(),
		"max_connections", maxConns)

	sig, stop := signal.NotifyContext(ctx, syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	select {
	case err := <-served:
		gw.Close()
		_ = node.Close(context.Background())
		return fmt.Errorf("http server: %w", err)
	case <-sig.Done():
	case <-node.LeaveRequested():
		log.Info("leaving the cluster on an operator's request")
	}
	log.Info("shutting down: no new requests, finishing in-flight ones")
	shutdownCtx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := srv.Shutdown(shutdownCtx); err != nil && !errors.Is(err, http.ErrServerClosed) {
		log.Warn("http shutdown", "err", err)
	}
	<-served   // Serve returns at once when Shutdown begins: its goroutine is done
	gw.Close() // websockets are hijacked connections: Shutdown leaves them open
	// The node's own budget: in a cluster, Close hands every partition off first
	// (about 10 s per GiB measured), whatever the HTTP shutdown took.
	closeCtx, cancelClose := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancelClose()
	if err := node.Close(closeCtx); err != nil {
		return fmt.Errorf("close node: %w", err)
	}
	log.Info("stopped")
	return nil
}

// newHTTPServer returns the node's net/http server (the Front hands it the
// requests it does not serve itself). Every connection holds a
// descriptor and a slot under the connection cap, so none may stay idle
// forever: headers must arrive within ReadHeaderTimeout and a kept-alive
// connection closes after IdleTimeout. There is deliberately no ReadTimeout
// (net/http would cancel a long poll's context when it passed); the gateway
// bounds the body itself (gateway.Config.BodyTimeout). Websockets are hijacked
// and keep their own heartbeat timeout.
func newHTTPServer(log *slog.Logger) *http.Server {
	return &http.Server{
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       90 * time.Second,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
}

// raiseFileLimit raises the soft limit on open descriptors (RLIMIT_NOFILE) to
// the hard limit, logs it, and returns the soft limit in force; 0 if unknown.
// (Go raises it too when the program starts; doing it here says so in the log
// and does not depend on that.)
func raiseFileLimit(log *slog.Logger) uint64 {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		log.Warn("cannot read the open-file limit", "err", err)
		return 0
	}
	if lim.Cur < lim.Max {
		from := lim.Cur
		lim.Cur = lim.Max
		if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
			log.Warn("cannot raise the open-file limit", "soft", from, "hard", lim.Max, "err", err)
			return from
		}
		log.Info("raised the open-file limit to the hard limit", "from", from, "to", lim.Cur)
		return lim.Cur
	}
	log.Info("open-file limit", "limit", lim.Cur)
	return lim.Cur
}

// defaultConnectionCap is the cap when the descriptor limit is unknown.
const defaultConnectionCap = 1024

// connectionCap returns the cap on open HTTP connections: configured, or half
// the descriptor limit, which leaves the other half to the storage (Badger's
// tables and value logs, the write-ahead log's segments, the cold store).
func connectionCap(configured int, fileLimit uint64, log *slog.Logger) int {
	if configured > 0 {
		if fileLimit > 0 && uint64(configured) > fileLimit/2 {
			log.Warn("maxConnections leaves the storage less than half the open-file limit; "+
				"a flood of connections can then make writes fail", "max_connections", configured, "open_file_limit", fileLimit)
		}
		return configured
	}
	if fileLimit == 0 {
		return defaultConnectionCap
	}
	return int(max(min(fileLimit/2, math.MaxInt32), 1))
}

// newLogger returns the node's logger: slog text or JSON lines on w.
func newLogger(w io.Writer, format, level string) (*slog.Logger, error) {
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("--log-level %q: want debug, info, warn or error", level)
	}
	opts := &slog.HandlerOptions{Level: lv}
	switch format {
	case "text":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	case "json":
		// A duration as Go writes it ("1.5s", as the text format does), not
		// slog's JSON default of integer nanoseconds.
		opts.ReplaceAttr = func(_ []string, a slog.Attr) slog.Attr {
			if a.Value.Kind() == slog.KindDuration {
				a.Value = slog.StringValue(a.Value.Duration().String())
			}
			return a
		}
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	}
	return nil, fmt.Errorf("--log-format %q: want text or json", format)
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

// startDevCluster starts an embedded etcd under the data directory, its client
// port on 127.0.0.1:port (0: any free port), and points cfg at it as a
// cluster named "dev" whose first node is "dev-1". It prints the endpoint on
// out, since other nodes need it to join (issue 26: it was only in the log).
func startDevCluster(cfg *config.Config, port int, out io.Writer, log *slog.Logger) (stop func(), err error) {
	dc := devetcd.Config{Dir: filepath.Join(cfg.DataDir, "etcd")}
	if port != 0 {
		dc.ClientAddr = net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	}
	e, err := devetcd.Start(dc)
	if err != nil {
		return nil, fmt.Errorf("--dev-cluster: %w", err)
	}
	// One copy: a dev cluster starts serving at once, alone (a replicated
	// one would wait for more nodes before it forms; docs/replication.md says
	// how to try three nodes).
	cfg.Cluster = &config.Cluster{Name: "dev", NodeID: "dev-1", Advertise: "127.0.0.1:0", ReplicationFactor: 1}
	cfg.Cluster.Etcd.Endpoints = []string{e.Endpoint()}
	log.Info("dev cluster: embedded etcd", "endpoint", e.Endpoint())
	fmt.Fprintf(out, "Dev cluster %q, node %q: embedded etcd at %s\n"+
		"  other nodes join with  cluster: {name: dev, nodeId: ..., advertise: ..., etcd: {endpoints: ['%s']}}\n",
		cfg.Cluster.Name, cfg.Cluster.NodeID, e.Endpoint(), e.Endpoint())
	return e.Close, nil
}

// goTypes are object types with Go code that the server runs. The holdfast
// command has none; a program that embeds it, or a test binary, may add some.
var goTypes []actors.TypeSpec

// typeOptions turns a type's configuration into the actors' options.
func typeOptions(t config.TypeConfig) actors.TypeOptions {
	r := t.Log.Retention
	var leases *actors.LeaseOptions
	if l := t.Log.Leases; l != nil {
		leases = &actors.LeaseOptions{MaxParallelism: l.MaxParallelism, LeaseDuration: l.LeaseDuration, MaxAttempts: l.MaxAttempts}
	}
	return actors.TypeOptions{
		ChangeLogEntries: t.Objects.ChangeLogEntries,
		Log: actors.LogOptions{
			MaxBatchSize: t.Log.MaxBatchSize,
			MaxAge:       r.MaxAge,
			MaxRecords:   r.MaxRecords,
			MaxBytes:     r.MaxBytes,
			TrimEvery:    r.TrimEvery,
			Cold:         t.Log.Cold,
			Leases:       leases,
		},
		Alarms: actors.AlarmOptions{MaxAttempts: t.Alarms.MaxAttempts, MaxPerObject: t.Alarms.MaxPerObject},
		Queue: actors.QueueOptions{
			Targets:             t.Queue.Targets,
			MaxAttempts:         t.Queue.MaxAttempts,
			VisibilityTimeout:   t.Queue.VisibilityTimeout,
			Backoff:             actors.Backoff{Initial: t.Queue.Backoff.Initial, Multiplier: t.Queue.Backoff.Multiplier, Max: t.Queue.Backoff.Max},
			MaxPending:          int(t.Queue.MaxPending),
			CompletedRetention:  t.Queue.CompletedRetention,
			DeadLetterRetention: t.Queue.DeadLetterRetention,
			Concurrency:         t.Queue.Concurrency,
		},
	}
}

// coldShared says whether every node of a cluster reads the cold segments
// any node flushed (cluster.Config.ColdShared): an S3 bucket, a directory
// every node mounts (cold.fs.shared), or a store no type flushes to, which
// holds nothing a failover could miss (the default private cold/fs directory
// is fine then).
func coldShared(cfg *config.Config) bool {
	return cfg.Cold.Store == "s3" || cfg.Cold.FS.Shared || !cfg.FlushesCold()
}

// openColdStore opens the cold store the configuration names (nil for "none").
func openColdStore(ctx context.Context, cfg *config.Config) (cold.Store, error) {
	switch cfg.Cold.Store {
	case "none":
		return nil, nil
	case "s3":
		c := cfg.Cold.S3
		var access, secret string
		if c.AccessKeyEnv != "" {
			access, secret = os.Getenv(c.AccessKeyEnv), os.Getenv(c.SecretKeyEnv)
		}
		store, err := colds3.Open(ctx, colds3.Config{
			Endpoint: c.Endpoint, Bucket: c.Bucket, AccessKey: access, SecretKey: secret,
			Secure: c.Secure, Region: c.Region, Prefix: c.Prefix,
		})
		if err != nil {
			return nil, fmt.Errorf("cold store: %w", err)
		}
		return store, nil
	default:
		store, err := coldfs.Open(cfg.Cold.FS.Dir)
		if err != nil {
			return nil, fmt.Errorf("cold store: %w", err)
		}
		return store, nil
	}
}

// refusePlantedBug stops a binary built with the plantedbug tag (replies
// before their writes are durable: the torture tool's own test) from serving,
// unless HOLDFAST_ALLOW_PLANTED_BUG=1 says this is that test.
func refusePlantedBug() error {
	if actors.PlantedBug && os.Getenv("HOLDFAST_ALLOW_PLANTED_BUG") != "1" {
		return errors.New("this binary was built with the plantedbug tag: it acknowledges writes before they are durable, for the torture tool's own test, and never serves otherwise (set HOLDFAST_ALLOW_PLANTED_BUG=1 in that test)")
	}
	if replication.PlantedRaftBug && os.Getenv("HOLDFAST_ALLOW_PLANTED_BUG") != "1" {
		return errors.New("this binary was built with the plantedraftbug tag: its raft leaders acknowledge writes before a majority holds them, for the torture tool's own test, and never serves otherwise (set HOLDFAST_ALLOW_PLANTED_BUG=1 in that test)")
	}
	return nil
}

// bodiesInFlight is the gateway's bound on the write bodies it serves at once:
// an eighth of the node's memory budget (each body lives in several copies
// until its write is durable), within [16 MiB, 1 GiB].
func bodiesInFlight(budget int64) int64 {
	if budget <= 0 {
		budget = actors.DefaultMemoryBudget()
	}
	return min(max(budget/8, 16<<20), 1<<30)
}
