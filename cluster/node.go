package cluster

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/holdfast/holdfast/actors"
	"github.com/holdfast/holdfast/alarms"
	"github.com/holdfast/holdfast/cold"
	"github.com/holdfast/holdfast/internal/storetune"
	"github.com/holdfast/holdfast/metrics"
	"github.com/holdfast/holdfast/persistence"
)

// Config configures a node.
type Config struct {
	// DataDir holds the node's database.
	DataDir string
	// Partitions is fixed when DataDir is created; zero means what DataDir holds,
	// or persistence.DefaultPartitions for a new one.
	Partitions int
	// IdleTimeout passivates idle objects; zero means 60s.
	IdleTimeout time.Duration
	// MemoryBudget bounds the Go heap the node's objects may fill, in bytes
	// (actors.Config.MemoryBudget); zero means half of the machine's memory.
	MemoryBudget int64
	// TypeOptions returns an object type's options; nil means the defaults.
	TypeOptions func(typ string) actors.TypeOptions
	// Types are the user-defined object types this node runs.
	Types []actors.TypeSpec
	// Logger is the node's logger; nil means slog.Default().
	Logger *slog.Logger
	// Cold is the node's cold segment store; nil means none.
	Cold cold.Store
	// ColdShared says that every node of the cluster reads the same cold
	// store (S3, or a directory every node mounts), or that no object type
	// flushes segments to it (config: no log.cold). A replicated cluster
	// requires it: a log's cold segments, flushed by one partition leader,
	// must stay readable from whichever replica leads next.
	ColdShared bool
	// ColdUnused says that no object type flushes segments to Cold (it is
	// only read, for segments of an earlier configuration): the nodes of a
	// replicated cluster then do not check that they share it (coldshare.go;
	// a private store is fine).
	ColdUnused bool
	// ColdTimeout bounds one cold store call; zero means 10s.
	ColdTimeout time.Duration
	// Alarms tunes the node's alarm scheduler (its window and memory bound); the
	// zero value is the defaults.
	Alarms alarms.Config
	// Cluster makes the node a member of a cluster of several nodes; nil means a
	// single node, which owns every partition.
	Cluster *ClusterConfig
	// Metrics, if set, receives the node's measurements (GET /metrics).
	Metrics *metrics.Metrics
	// Hooks observe the node's actors (tests); Metrics adds its own to them.
	Hooks actors.Hooks
	// Storage overrides storage sizes for this module's benchmarks and tests
	// (the type is internal); nil means the defaults.
	Storage *storetune.Config
}

// ErrNotOwner is returned by the fence for a write whose partition epoch is no
// longer this node's.
var ErrNotOwner = errors.New("cluster: partition not owned at this epoch")

// Node is one Holdfast node.
type Node struct {
	cfg   Config
	log   *slog.Logger
	db    *persistence.DB
	pipe  *persistence.Pipeline
	host  *actors.Host
	table *partitionTable
	ready atomic.Bool
	// storageID names the data directory (storageid.go).
	storageID string
	// member is the cluster half of a node of several; nil for a single node.
	member *member
}

// partitionTable says which partitions this node owns and under which epoch. For a
// single node every partition is owned at epoch 1, for good.
type partitionTable struct {
	epochs []atomic.Uint64 // 0: not owned
	// losses is each partition's PartEntry.Losses as of its take-up here.
	losses []atomic.Uint64
}

func (t *partitionTable) epoch(p uint32) uint64 { return t.epochs[p].Load() }

func (t *partitionTable) fence(p uint32, epoch uint64) error {
	if int(p) >= len(t.epochs) || t.epochs[p].Load() != epoch || epoch == 0 {
		return fmt.Errorf("%w: partition %d", ErrNotOwner, p)
	}
	return nil
}

// Start opens the node's database and starts its pipeline and actors. A member
// of a cluster then registers in etcd and takes up the partitions the table
// gives it; it serves nothing until then.
func Start(cfg Config) (*Node, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	n := &Node{cfg: cfg, log: cfg.Logger}
	if err := (&actors.Config{MemoryBudget: cfg.MemoryBudget}).Validate(); err != nil {
		return nil, err
	}
	var cli *clientv3.Client
	rf := 1
	var num uint64 // the node's raft node number (replicated clusters)
	if cfg.Cluster != nil {
		var err error
		if cli, cfg.Partitions, rf, err = joinCluster(cfg); err != nil {
			return nil, err
		}
		if rf > 1 && cfg.Cold != nil && !cfg.ColdShared {
			_ = cli.Close()
			return nil, fmt.Errorf("cluster: a replicated cluster (replicationFactor %d) needs a cold store that every node reads, since a log's cold segments must stay readable from whichever replica leads next: cold.store: s3, or cold.fs.shared: true with cold.fs.dir on a directory every node mounts, or no type with log.cold: true", rf)
		}
		if rf > 1 {
			if num, err = nodeNumber(context.Background(), cli, newKeys(cfg.Cluster.Name), cfg.Cluster.NodeID); err != nil {
				_ = cli.Close()
				return nil, err
			}
		}
	}
	dc := persistence.Config{Dir: cfg.DataDir, Partitions: cfg.Partitions, Logger: cfg.Logger, Replicated: rf > 1}
	dc.MemTableSize, dc.BlockCacheSize = storageForBudget(cfg.MemoryBudget)
	if st := cfg.Storage; st != nil && st.MemTableSize != 0 {
		dc.MemTableSize = st.MemTableSize
	}
	if st := cfg.Storage; st != nil {
		dc.SegmentSize, dc.ValueLogFileSize = st.SegmentSize, st.ValueLogFileSize
	}
	db, err := persistence.Open(dc)
	if err != nil {
		if cli != nil {
			_ = cli.Close()
		}
		return nil, err
	}
	n.db = db
	if n.storageID, err = loadStorageID(cfg.DataDir); err != nil {
		_ = db.Close()
		if cli != nil {
			_ = cli.Close()
		}
		return nil, err
	}
	n.table = &partitionTable{epochs: make([]atomic.Uint64, db.Partitions()), losses: make([]atomic.Uint64, db.Partitions())}
	if cfg.Metrics != nil {
		cfg.Cold = cfg.Metrics.Cold(cfg.Cold)
		n.cfg.Cold = cfg.Cold
	}
	pc := persistence.PipelineConfig{Fence: n.table.fence, Logger: cfg.Logger}
	if cfg.Storage != nil {
		pc.ValueLogGCEvery = cfg.Storage.ValueLogGCEvery
	}
	hc := actors.Config{
		IdleTimeout:  cfg.IdleTimeout,
		MemoryBudget: cfg.MemoryBudget,
		TypeOptions:  cfg.TypeOptions,
		Epoch:        n.table.epoch,
		DataLosses:   func(p uint32) uint64 { return n.table.losses[p].Load() },
		Logger:       cfg.Logger,
		Cold:         cfg.Cold,
		ColdTimeout:  cfg.ColdTimeout,
		Alarms:       cfg.Alarms,
		Hooks:        cfg.Hooks,
	}
	if m := cfg.Metrics; m != nil {
		pc.OnCommit = m.Commit
		hc.Hooks.Passivated, hc.Hooks.AlarmRan, hc.Hooks.Queue = m.Passivated, m.AlarmRan, m.Queue
	}
	if cli == nil {
		for i := range n.table.epochs {
			n.table.epochs[i].Store(1)
		}
	} else {
		// Every check goes through the member, made before anything runs.
		n.member = newMember(n, cli, db.Partitions())
		if rf > 1 && cfg.Cold != nil && !cfg.ColdUnused {
			// Flushes go through the check that every node reads this
			// store (coldshare.go).
			n.member.coldShare = newColdShare(cfg.Cold, cfg.Cluster.Name, cfg.Cluster.NodeID, n.member.boot,
				cmp.Or(cfg.Cluster.coldShareGrace, coldShareGrace), cfg.Logger.With("node", cfg.Cluster.NodeID))
			hc.Cold = n.member.coldShare
		}
		pc.Fence = func(p uint32, e uint64) error { return n.member.fence(p, e) }
		pc.AckFence = func(p uint32, e uint64) error { return n.member.ackFence(p, e) }
		hc.Epoch = func(p uint32) uint64 { return n.member.servingEpoch(p) }
		hc.Partitions = func() []uint32 { return n.member.served() }
	}
	var hostPipe actors.Pipeline
	if rf > 1 {
		// Every write of a replicated node is a raft proposal; nothing is
		// written to a partition without one.
		pc.Fence = func(p uint32, _ uint64) error { return notServedErr(p) }
		pc.AckFence = nil
		n.pipe = persistence.NewPipeline(db, pc)
		n.pipe.Start() // the WAL pipeline and the engine write through it
		r, err := newReplicated(n, *cfg.Cluster, rf, num)
		if err != nil {
			n.pipe.Close()
			_ = db.Close()
			_ = cli.Close()
			return nil, err
		}
		n.member.r, r.m = r, n.member
		hostPipe = r.prop
	} else {
		n.pipe = persistence.NewPipeline(db, pc)
		hostPipe = n.pipe
	}
	n.host = actors.NewHost(db, hostPipe, hc)
	for _, t := range cfg.Types {
		if err := n.host.RegisterType(t); err != nil {
			n.closeStorage()
			return nil, err
		}
	}
	if rf == 1 {
		n.pipe.Start()
	}
	n.host.Start()
	if cli != nil {
		if err := n.member.start(); err != nil {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			_ = n.host.Close(ctx)
			n.closeStorage()
			_ = cli.Close()
			return nil, err
		}
	}
	if m := cfg.Metrics; m != nil {
		n.registerMetrics(m)
	}
	n.ready.Store(true)
	return n, nil
}

// registerMetrics registers the gauges and counters that read the node's own
// state at scrape time.
func (n *Node) registerMetrics(m *metrics.Metrics) {
	m.CounterFunc("holdfast_commits_total", "Commits, each covered by one sync.", func() float64 { return float64(n.pipe.Stats().Commits) })
	m.CounterFunc("holdfast_writes_total", "Writes made durable.", func() float64 { return float64(n.pipe.Stats().Writes) })
	m.CounterFunc("holdfast_write_failures_total", "Writes that failed (fenced, too large, storage failure).", func() float64 { return float64(n.pipe.Stats().Failed) })
	m.CounterFunc("holdfast_value_log_reclaimed_files_total", "Files of Badger's value log (values of 1 MiB and more) that its GC rewrote and deleted.", func() float64 {
		return float64(n.pipe.Stats().ValueLogReclaimed)
	})
	m.GaugeFunc("holdfast_value_log_bytes", "Disk bytes of Badger's value-log files, where values of 1 MiB and more are stored.", func() float64 {
		b, err := n.db.ValueLogBytes()
		if err != nil {
			n.log.Warn("could not measure the value log", "err", err)
		}
		return float64(b)
	})
	m.GaugeFunc("holdfast_commit_queue_writes", "Writes waiting for the committer (every object's mailbox feeds it).", func() float64 { return float64(n.pipe.Queued()) })
	m.GaugeFunc("holdfast_objects_active", "Active objects (activations in memory).", func() float64 { return float64(n.host.Active()) })
	m.GaugeFunc("holdfast_objects_mailbox_requests", "Requests queued in or run by objects now (their mailboxes' depth).", func() float64 { return float64(n.host.Inflight()) })
	m.GaugeFunc("holdfast_memory_budget_bytes", "The node's memory budget.", func() float64 { return float64(n.host.MemoryStats().Budget) })
	m.GaugeFunc("holdfast_memory_live_bytes", "The live Go heap at the memory governor's last sample.", func() float64 { return float64(n.host.MemoryStats().Live) })
	m.CounterFunc("holdfast_memory_passivations_total", "Objects passivated to bring the heap under the memory budget.", func() float64 { return float64(n.host.MemoryStats().Passivated) })
	m.CounterFunc("holdfast_memory_refusals_total", "Requests refused (503) over the memory budget.", func() float64 { return float64(n.host.MemoryStats().Refused) })
	m.GaugeFunc("holdfast_alarms_resident", "Alarm index entries held in memory by the scheduler.", func() float64 { return float64(n.host.Scheduler().Stats().Resident) })
	m.QueueDepth(func() (int, [4]int64, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		d, err := n.host.QueueDepth(ctx)
		if err != nil {
			n.log.Warn("metrics: cannot read the queue depth", "err", err)
			return 0, [4]int64{}, err
		}
		return d.Queues, [4]int64{d.Pending, d.Processing, d.Complete, d.Failed}, nil
	})
	if r := n.member.replicatedHalf(); r != nil {
		r.registerMetrics(m)
	}
	if c := n.member.coldShareCheck(); c != nil {
		m.GaugeFunc("holdfast_cold_store_shared", "1 once this node found every live node's marker in the cold store, 0 while it refuses cold writes (its store may not be the one every node reads).", func() float64 {
			if c.notShared() != nil {
				return 0
			}
			return 1
		})
	}
	m.GaugeFunc("holdfast_partitions_served", "Partitions this node serves now.", func() float64 {
		if n.member == nil {
			return float64(len(n.table.epochs))
		}
		return float64(len(n.member.served()))
	})
}

// Request sends msg to object id on the node that owns it and returns the reply.
func (n *Node) Request(ctx context.Context, id actors.ObjectID, msg any) (any, error) {
	v, _, err := n.RequestServed(ctx, id, msg)
	return v, err
}

// RequestAsync starts Request without a goroutine waiting for its reply:
// done (which must not block) gets the reply once every write before it is
// durable, as Request's caller would. It reports false, and never calls done,
// when this node cannot start the request that way: in a cluster, when this
// node does not serve the object's partition now (the caller then uses
// Request, which forwards it). A partition that leaves this node between the
// check and the object's turn answers a 503 with a retry hint (Request would
// have looked for its new server). There is no timeout: the caller keeps its
// own; ctx only carries the served record (actors.WithServedRecord).
//
// Why: a batch of 100 writes held 100 goroutines, each with its own timeout
// context, each woken by its reply (gateway.Server.batch).
func (n *Node) RequestAsync(ctx context.Context, id actors.ObjectID, msg any, done func(any, error)) bool {
	if n.member != nil {
		return n.member.requestAsync(id, msg, func(v any, s Served, err error) {
			if s.Epoch != 0 {
				actors.RecordServed(ctx, s)
			}
			done(v, err)
		})
	}
	n.host.RequestAsync(id, msg, func(v any, err error) {
		if err == nil || !actors.NotServed(err) {
			actors.RecordServed(ctx, n.servedAlone(id))
		}
		done(v, err)
	})
	return true
}

// servedAlone is what served a request for id on a node outside a cluster.
func (n *Node) servedAlone(id actors.ObjectID) Served {
	return Served{Partition: persistence.Partition(id, len(n.table.epochs)), Epoch: 1}
}

// RequestServed is Request that also says which node served the request, for
// which partition, under which epoch (zero when none did).
func (n *Node) RequestServed(ctx context.Context, id actors.ObjectID, msg any) (v any, s Served, err error) {
	if n.member != nil {
		v, s, err = n.member.request(ctx, id, msg)
	} else {
		v, err = n.host.Request(ctx, id, msg)
		if err == nil || !actors.NotServed(err) {
			s = n.servedAlone(id)
		}
	}
	if s.Epoch != 0 {
		actors.RecordServed(ctx, s)
	}
	return v, s, err
}

// LeaveRequested is closed when an operator asked this node to leave its
// cluster (`holdfast cluster leave`): the program should stop as on SIGTERM
// (Close hands the partitions off first). Never closed for a single node.
func (n *Node) LeaveRequested() <-chan struct{} {
	if n.member == nil {
		return nil
	}
	return n.member.leaveAsked
}

// Ready reports whether the node serves requests: started, not closing, and its
// storage has not failed.
func (n *Node) Ready() bool { return n.ready.Load() && n.pipe.Failed() == nil }

// RefusesWrites reports whether writes that add data are refused now, with a
// 503 the client may retry: the node is over its memory budget, or its storage
// is short of a resource (StorageHealth). The gateway then refuses a write
// before it reads its body.
func (n *Node) RefusesWrites() bool { return n.host.RefusesWrites() || n.pipe.Unavailable() != nil }

// StorageHealth reports the node's storage: fatal is the error that failed
// the commit pipeline, which only a restart repairs (the log replays at
// start); unavailable is non-nil while the storage cannot take writes: failed,
// or short of a resource for now (persistence.Pipeline.Unavailable: no
// descriptor or space for a log segment, Badger far behind the log).
func (n *Node) StorageHealth() (fatal, unavailable error) {
	if err := n.pipe.Failed(); err != nil {
		return err, err
	}
	return nil, n.pipe.Unavailable()
}

// Stats is a snapshot of the node's counters.
type Stats struct {
	Pipeline      persistence.PipelineStats
	ActiveObjects int
	Alarms        alarms.Stats
}

// Stats returns the node's counters.
func (n *Node) Stats() Stats {
	return Stats{Pipeline: n.pipe.Stats(), ActiveObjects: n.host.Active(), Alarms: n.host.Scheduler().Stats()}
}

// AlarmsReady is closed once the alarm scheduler loaded its index after start:
// from then on, alarms that fell due while the node was down are firing.
func (n *Node) AlarmsReady() <-chan struct{} { return n.host.Scheduler().Ready() }

// ReplaySummary returns the summary of the queue replay the node ran when it
// started, for app's queues only, and whether it has finished.
func (n *Node) ReplaySummary(app string) (actors.ReplaySummary, bool) {
	return n.host.ReplaySummary(app)
}

// StorageID returns the storage ID of the node's data directory: made at
// random when the directory was first opened, it tells the cluster whether a
// node's partitions are served from the disk they were served from before.
func (n *Node) StorageID() string { return n.storageID }

// Partitions returns the partition count of the node's data directory.
func (n *Node) Partitions() int { return n.db.Partitions() }

// Close stops admitting requests, lets every admitted one finish (their writes
// become durable), then closes the pipeline and the database. ctx bounds the wait.
func (n *Node) Close(ctx context.Context) error {
	if n.member != nil {
		if err := n.member.leave(ctx); err != nil {
			n.log.Warn("leaving the cluster: not every partition was handed off", "err", err)
		}
	}
	n.ready.Store(false)
	if n.member != nil {
		n.member.stop(true)
	}
	err := n.host.Close(ctx)
	if cerr := n.closeStorage(); cerr != nil && err == nil {
		err = fmt.Errorf("close database: %w", cerr)
	}
	return err
}

// closeStorage closes what writes to the database, then the database: the
// raft half of a replicated node (the engine may still apply entries), the
// pipeline, then Badger. The host must be closed (or never started).
func (n *Node) closeStorage() error {
	if n.member != nil && n.member.r != nil {
		n.member.r.close()
	}
	n.pipe.Close()
	return n.db.Close()
}

// storageForBudget sizes Badger's memory from the node's memory budget (0:
// actors.DefaultMemoryBudget): memtables (four may be in memory: the current
// one and three being flushed) of budget/32 and a block cache of budget/16,
// each within [16 MiB, its default of 128 or 256 MiB], so that Badger's fixed
// memory stays under about a fifth of the budget. The memory governor can free
// only objects' memory; with Badger's defaults a 512 MiB budget was 80% full
// with no object active, and the governor refused every new object for good
// (bench/overload). From a budget of 4 GiB up, Badger keeps its defaults.
func storageForBudget(budget int64) (memtable, blockCache int64) {
	if budget <= 0 {
		budget = actors.DefaultMemoryBudget()
	}
	clamp := func(v, lo, hi int64) int64 { return min(max(v, lo), hi) }
	return clamp(budget/32, 16<<20, 128<<20), clamp(budget/16, 16<<20, 256<<20)
}
