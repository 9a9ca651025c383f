package cluster

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/holdfast/holdfast/actors"
	"github.com/holdfast/holdfast/internal/owner"
	"github.com/holdfast/holdfast/persistence"
)

// ClusterConfig makes a node a member of a cluster of several nodes
// (spec/cluster.md). Nil in Config means a single node.
type ClusterConfig struct {
	// Name names the cluster; every node of one cluster uses the same.
	Name string
	// NodeID is unique within the cluster and stable across restarts: a node's
	// partitions wait for the node of that id to come back with its data.
	NodeID string
	// Advertise is the host:port other nodes reach this one at (the cluster
	// transport, remote.go). Port 0 picks a free port (tests).
	Advertise string
	// Bind is the host:port this node listens on for other nodes; empty means
	// Advertise. Something between the nodes (NAT, a container's port
	// mapping, a test's proxy) forwards Advertise to it.
	Bind string
	// Endpoints are etcd's client endpoints.
	Endpoints []string
	// LeaseTTL is the etcd lease a node serves its partitions under: a node cut
	// off from etcd stops serving within it, and a crashed node's partitions show
	// as unavailable after it. Whole seconds, at least 2; zero means 5s.
	LeaseTTL time.Duration
	// HTTP is the node's HTTP address, shown by `holdfast cluster status`.
	HTTP string
	// MaxMoves bounds the partition handoffs the controller runs at once; zero
	// means 4.
	MaxMoves int
	// RequestWait bounds how long a request waits for a partition that is moving
	// or being taken up before it gets 503 with retryAfterMs; zero means 5s.
	RequestWait time.Duration
	// ReplicationFactor is how many replicas each partition has, fixed when
	// the cluster is created (a node configured otherwise is refused). Zero
	// means the cluster's, or DefaultReplicationFactor for a new cluster. 1
	// is one copy per partition, owned through etcd and handed off between
	// nodes; above 1 each partition is a raft group (replicated.go).
	ReplicationFactor int
	// FailoverTimeout is how long a partition's replicas go without hearing
	// from its leader before they elect another (raft's election timeout,
	// 10 ticks); zero means 1s. Replicated clusters only.
	FailoverTimeout time.Duration
	// RaftAdvertise is the host:port other nodes reach this node's raft
	// carrier at, and RaftBind where it listens. Empty means Advertise's
	// (Bind's) host with the port one above; port 0 picks a free port.
	// Replicated clusters only.
	RaftAdvertise string
	RaftBind      string
	// ReplaceAfter is how long a node with replicas may be down before the
	// controller re-creates them on other nodes; zero means 10m.
	// Replicated clusters only.
	ReplaceAfter time.Duration

	// formAfter is how long a replicated cluster with fewer live nodes than
	// its replication factor waits before it forms its partitions with the
	// nodes it has (the groups grow as more join); zero means 10s. Tests set
	// it.
	formAfter time.Duration
	// coldShareEvery and coldShareGrace set the cold store share check's
	// round and grace (coldshare.go); zero means the defaults. Tests set
	// them short.
	coldShareEvery, coldShareGrace time.Duration
	// balanceAtOnce overrides the leadership balancing's transfers per pass
	// (0: balanceAtOnce), and balancePassed, if set, hears each pass that
	// handed groups over: when it started and ended, and whether the next
	// pass follows at once (replicated.go). Tests set them.
	balanceAtOnce int
	balancePassed func(start, end time.Time, more bool)
}

// Served says who answered a request: the node, the object's partition, and the
// partition's epoch on that node. Tests check ownership with it.
type Served = actors.Served

// local states of a partition on this node
const (
	stIdle      = iota // not served here; may hold stale data until cleaned
	stServing          // served at table epoch
	stHandoff          // being handed off (serving until frozen)
	stImporting        // receiving a handoff
	stCleaning         // deleting data this node no longer owns
)

// member is the cluster half of a Node.
type member struct {
	n   *Node
	cfg ClusterConfig
	id  string
	log *slog.Logger
	// events gathers per-partition events into one INFO line a run
	// (eventlog.go); nil in a client member.
	events *memberEvents
	cli    *clientv3.Client
	k      keys
	view   *view
	tr     *transport

	sess atomic.Pointer[session]
	boot string
	// coldShare checks that every node reads the cold store, and guards
	// its writes (replicated clusters with a cold store; nil otherwise).
	coldShare *coldShare
	// storage is the storage ID of this node's data directory; a partition
	// recorded under another one is refused (refusedBy), never served.
	storage string

	mu    sync.Mutex
	state []uint8
	// aux is the epoch the writes of an import or a cleanup carry (high bit set,
	// never a table epoch), per partition; 0 when none runs.
	aux     []atomic.Uint64
	auxSeq  atomic.Uint64
	imports map[uint32]*importState
	retryAt map[uint32]time.Time // no handoff of p before then (after a failure)
	boots   map[string]string    // the boot last seen of each node (noteBoots)
	stale   map[uint32]bool      // partitions with data this node does not own
	// refused holds the partitions this node owns and refuses to serve, each
	// with the storage ID it was served from; refusedLog is what was last
	// logged of it.
	refused    map[uint32]string
	refusedLog string

	// r is the raft half of a member of a replicated cluster; nil when the
	// cluster keeps one copy of each partition.
	r *replicated

	subs    *remoteSubs
	kick    chan struct{}
	leaving atomic.Bool
	// leaveAsked is closed when an operator asked this node to leave.
	leaveAsked chan struct{}
	askedOnce  sync.Once
	// owned owns every goroutine of the member (goOwned); ctx is its
	// context, and cancel (its Stop) ends it and refuses new goroutines.
	owned  *owner.Group
	ctx    context.Context
	cancel context.CancelFunc

	// beforeSwitch, when set (tests), runs before a handoff switches the table
	// entry cur of partition p; an error stands for the switch's own error.
	beforeSwitch atomic.Pointer[func(p uint32, cur PartEntry) error]
}

func newBoot() string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// joinCluster connects to etcd and settles the partition count and the
// replication factor: the cluster's if it exists, else this data directory's
// (or cfg.Partitions) and the configured one, recorded in etcd.
func joinCluster(cfg Config) (cli *clientv3.Client, parts, rf int, err error) {
	cc := cfg.Cluster
	if cc.Name == "" || cc.NodeID == "" || cc.Advertise == "" || len(cc.Endpoints) == 0 {
		return nil, 0, 0, errors.New("cluster: name, nodeId, advertise and etcd endpoints are all required")
	}
	if cc.ReplicationFactor < 0 || cc.ReplicationFactor > maxReplicationFactor {
		return nil, 0, 0, fmt.Errorf("cluster: replicationFactor %d: expected 1 to %d", cc.ReplicationFactor, maxReplicationFactor)
	}
	cli, parts, rf, err = joinClusterMeta(cfg)
	if err == nil && cc.ReplicationFactor != 0 && cc.ReplicationFactor != rf {
		_ = cli.Close()
		return nil, 0, 0, fmt.Errorf("cluster %q keeps %d replicas of each partition, this node is configured with cluster.replicationFactor %d; it is fixed when a cluster is created", cc.Name, rf, cc.ReplicationFactor)
	}
	return cli, parts, rf, err
}

// maxReplicationFactor bounds cluster.replicationFactor.
const maxReplicationFactor = 7

// DefaultReplicationFactor is a new cluster's replication factor when its
// first node's configuration sets none (spec/cluster.md). A cluster created
// by an earlier version without one keeps one copy (clusterMeta.rf).
const DefaultReplicationFactor = 3

func joinClusterMeta(cfg Config) (*clientv3.Client, int, int, error) {
	cc := cfg.Cluster
	cli, err := clientv3.New(clientv3.Config{Endpoints: cc.Endpoints, DialTimeout: 5 * time.Second, Logger: zapNop()})
	if err != nil {
		return nil, 0, 0, fmt.Errorf("cluster: connect to etcd: %w", err)
	}
	k := newKeys(cc.Name)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := cli.Get(ctx, k.meta())
	if err != nil {
		_ = cli.Close()
		return nil, 0, 0, fmt.Errorf("cluster: read the cluster from etcd %v: %w", cc.Endpoints, err)
	}
	if len(resp.Kvs) == 1 {
		var m clusterMeta
		if err := json.Unmarshal(resp.Kvs[0].Value, &m); err != nil {
			_ = cli.Close()
			return nil, 0, 0, fmt.Errorf("cluster meta: %w", err)
		}
		if cfg.Partitions != 0 && cfg.Partitions != m.Partitions {
			_ = cli.Close()
			return nil, 0, 0, fmt.Errorf("cluster %q has %d partitions, this node is configured with %d", cc.Name, m.Partitions, cfg.Partitions)
		}
		return cli, m.Partitions, m.rf(), nil
	}
	return cli, cfg.Partitions, cmp.Or(cc.ReplicationFactor, DefaultReplicationFactor), nil
}

// newMember returns the cluster half of n, serving nothing, before the node's
// pipeline and actors start (they ask it about every write and request).
func newMember(n *Node, cli *clientv3.Client, parts int) *member {
	cc := *n.cfg.Cluster
	if cc.LeaseTTL == 0 {
		cc.LeaseTTL = 5 * time.Second
	}
	if cc.MaxMoves <= 0 {
		cc.MaxMoves = 4
	}
	if cc.RequestWait <= 0 {
		cc.RequestWait = 5 * time.Second
	}
	if cc.ReplaceAfter <= 0 {
		cc.ReplaceAfter = 10 * time.Minute
	}
	if cc.formAfter <= 0 {
		cc.formAfter = 10 * time.Second
	}
	m := &member{
		n: n, cfg: cc, id: cc.NodeID, log: n.log.With("node", cc.NodeID), cli: cli, k: newKeys(cc.Name),
		view: newView(parts), boot: newBoot(), storage: n.storageID, refused: map[uint32]string{},
		state: make([]uint8, parts), aux: make([]atomic.Uint64, parts),
		imports: map[uint32]*importState{}, retryAt: map[uint32]time.Time{}, stale: map[uint32]bool{},
		kick: make(chan struct{}, 1), leaveAsked: make(chan struct{}), subs: newRemoteSubs(),
	}
	m.events = newMemberEvents(m.log)
	m.owned = owner.New(nil)
	m.ctx, m.cancel = m.owned.Context(), m.owned.Stop
	return m
}

// goOwned runs f on a goroutine of m.owned: stop cancels m.ctx and waits for
// it. Once stop began it does not run f (whose loops would end at once).
func (m *member) goOwned(f func()) { m.owned.Go(func(context.Context) { f() }) }

// start registers the node, starts the transport, follows the cluster's state
// and takes up the partitions the table gives this node.
func (m *member) start() error {
	n, cli := m.n, m.cli
	parts := len(m.state)
	rf := 1
	if m.r != nil {
		rf = m.r.rf
	}
	if err := ensureMeta(m.ctx, cli, m.k, parts, rf); err != nil {
		return err
	}
	// Data this node holds for partitions it may not own: checked against the
	// table once it is read, cleaned if someone else owns them.
	for p := range uint32(parts) {
		if m.r != nil {
			break // a replicated node's data belongs to its replicas
		}
		if ok, err := n.db.HasPrefix(m.ctx, persistence.PartitionPrefix(p)); err != nil {
			return err
		} else if ok {
			m.stale[p] = true
		}
	}
	tr, err := startTransport(m.cfg.Advertise, m.cfg.Bind, m.serveRemote, m.serveObject, m.serveFeed, m.log)
	if err != nil {
		return err
	}
	m.tr = tr
	m.goOwned(func() { m.view.follow(m.ctx, cli, m.k, m.log) })
	if err := m.newSession(); err != nil {
		m.cancel()
		_ = m.owned.Wait(context.Background())
		tr.stop()
		return err
	}
	if m.r != nil {
		if err := m.r.start(); err != nil {
			m.cancel()
			_ = m.owned.Wait(context.Background())
			tr.stop()
			return err
		}
		m.goOwned(m.r.servingLoop)
		m.goOwned(m.r.balanceLoop)
		m.goOwned(m.r.reportLoop)
		m.goOwned(m.r.moveLoop)
	}
	if c := m.coldShare; c != nil {
		every := cmp.Or(m.cfg.coldShareEvery, coldShareEvery)
		timeout := cmp.Or(m.n.cfg.ColdTimeout, 10*time.Second)
		m.goOwned(func() {
			c.loop(m.ctx, every, timeout, func() map[string]NodeInfo {
				nodes, _, _, _ := m.view.snapshot()
				return nodes
			})
		})
	}
	m.goOwned(m.sessionLoop)
	m.goOwned(m.reconcileLoop)
	m.goOwned(m.controllerLoop)
	m.goOwned(m.reachLoop)
	return nil
}

// newSession grants a lease and registers the node under it. A previous run's
// registration (a crash) is waited out: its lease expires within its TTL.
func (m *member) newSession() error {
	deadline := time.Now().Add(3*m.cfg.LeaseTTL + 10*time.Second)
	for {
		s, err := newSession(m.ctx, m.cli, m.cfg.LeaseTTL, m.log)
		if err == nil {
			b, _ := json.Marshal(m.info(s))
			key := m.k.node(m.id)
			ctx, cancel := context.WithTimeout(m.ctx, 5*time.Second)
			var resp *clientv3.TxnResponse
			resp, err = m.cli.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0)).
				Then(clientv3.OpPut(key, string(b), clientv3.WithLease(s.lease))).Else(clientv3.OpGet(key)).Commit()
			cancel()
			if err == nil && resp.Succeeded {
				m.sess.Store(s)
				m.goOwned(func() { s.keepAlive(m.ctx) })
				m.log.Info("registered in the cluster", "lease", int64(s.lease), "addr", m.tr.addr)
				m.poke()
				return nil
			}
			if err == nil {
				var old NodeInfo
				if kvs := resp.Responses[0].GetResponseRange().Kvs; len(kvs) == 1 {
					_ = json.Unmarshal(kvs[0].Value, &old)
				}
				if old.Boot == m.boot { // our own earlier session: take it over
					ctx, cancel := context.WithTimeout(m.ctx, 5*time.Second)
					_, err = m.cli.Put(ctx, key, string(b), clientv3.WithLease(s.lease))
					cancel()
					if err == nil {
						m.sess.Store(s)
						m.goOwned(func() { s.keepAlive(m.ctx) })
						m.poke()
						return nil
					}
				} else {
					err = fmt.Errorf("node id %q is registered by another live process (boot %s) or by this node's previous run, whose lease has not expired yet", m.id, old.Boot)
				}
			}
			s.revoke()
		}
		if m.ctx.Err() != nil {
			return m.ctx.Err()
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("cluster: register node %q: %w", m.id, err)
		}
		m.log.Info("waiting to register in the cluster", "err", err)
		sleep(m.ctx, 500*time.Millisecond)
	}
}

// info is this node's registration under session s.
func (m *member) info(s *session) NodeInfo {
	info := NodeInfo{ID: m.id, Addr: m.tr.addr, HTTP: m.cfg.HTTP, Boot: m.boot, Lease: int64(s.lease), Leaving: m.leaving.Load(), Storage: m.storage}
	if m.r != nil {
		info.Raft, info.Num = m.r.raftAddr, uint64(m.r.num)
	}
	info.ColdMarker = m.coldShare != nil
	return info
}

// sessionLoop replaces a lost lease: the node stops serving everything (it may
// have been cut off long enough for etcd to expire it), then registers again and
// takes its partitions up under new epochs.
func (m *member) sessionLoop() {
	for {
		s := m.sess.Load()
		select {
		case <-m.ctx.Done():
			return
		case <-s.Lost():
		}
		if m.r == nil {
			// A replicated node serves under its raft leases, not etcd's.
			m.stopServingAll()
		}
		if m.ctx.Err() != nil {
			return
		}
		if err := m.newSession(); err != nil && m.ctx.Err() == nil {
			m.log.Error("cannot register in the cluster again", "err", err)
			sleep(m.ctx, time.Second)
		}
	}
}

func (m *member) poke() {
	select {
	case m.kick <- struct{}{}:
	default:
	}
}

// leaseValid reports whether this node's lease certainly holds now.
func (m *member) leaseValid() bool {
	s := m.sess.Load()
	return s != nil && s.valid()
}

// servingEpoch is partition p's epoch if this node serves it now, else 0.
func (m *member) servingEpoch(p uint32) uint64 {
	if m.n == nil {
		return 0 // a client member serves nothing
	}
	if m.r != nil {
		return m.r.epoch(p)
	}
	e := m.n.table.epochs[p].Load()
	if e == 0 || !m.leaseValid() {
		return 0
	}
	return e
}

// fence is the commit pipeline's check: a write commits only under the epoch
// the partition is served at, while the lease holds, or as part of this node's
// own import or cleanup of the partition.
func (m *member) fence(p uint32, epoch uint64) error {
	if int(p) >= len(m.aux) || epoch == 0 {
		return notServedErr(p)
	}
	if epoch == m.aux[p].Load() {
		return nil
	}
	if m.n.table.epochs[p].Load() != epoch {
		return notServedErr(p)
	}
	if !m.leaseValid() {
		return &actors.Error{Kind: actors.KindUnavailable, Code: actors.CodeNotServed, Msg: "this node lost its cluster lease; the write was not made", RetryAfter: time.Second}
	}
	return nil
}

// ackFence is asked once a write is durable: it is acknowledged only while the
// lease still holds.
func (m *member) ackFence(p uint32, epoch uint64) error {
	if int(p) < len(m.aux) && epoch == m.aux[p].Load() {
		return nil
	}
	if !m.leaseValid() {
		return &actors.Error{Kind: actors.KindUnavailable, Msg: "this node lost its cluster lease during the write; its outcome is unknown", RetryAfter: time.Second}
	}
	return nil
}

func notServedErr(p uint32) error {
	return &actors.Error{Kind: actors.KindUnavailable, Code: actors.CodeNotServed, Msg: fmt.Sprintf("partition %d is not served by this node now", p), RetryAfter: 100 * time.Millisecond}
}

// served lists the partitions this node serves (alarms and queue replay).
func (m *member) served() []uint32 {
	if m.r != nil {
		return m.r.served()
	}
	var out []uint32
	for p := range m.n.table.epochs {
		if m.n.table.epochs[p].Load() != 0 {
			out = append(out, uint32(p))
		}
	}
	return out
}

// stopServing stops serving p: requests get "not served" (and are routed
// again), activations are dropped. The caller holds m.mu.
func (m *member) stopServing(p uint32) {
	if m.n.table.epochs[p].Swap(0) != 0 {
		m.n.host.DropPartition(p)
		m.n.host.Scheduler().Reset()
	}
}

// stopServingAll stops serving every partition (the lease is lost).
func (m *member) stopServingAll() {
	m.mu.Lock()
	defer m.mu.Unlock()
	for p := range m.state {
		if m.state[p] == stServing || m.state[p] == stHandoff {
			m.stopServing(uint32(p))
			m.state[p] = stIdle
		}
	}
}

// request runs msg on object id wherever its partition is served: here, or on
// the owner through the transport. A request for a partition that is moving or
// being taken up waits for it (at most RequestWait); one for a partition whose
// owner is down gets 503 at once.
func (m *member) request(ctx context.Context, id actors.ObjectID, msg any) (any, Served, error) {
	if err := actors.ValidateID(id); err != nil {
		return nil, Served{}, err
	}
	if u, ok := msg.(actors.KVUnsubscribe); ok && m.unsubscribeRemote(ctx, u.Sub) {
		return nil, Served{}, nil // it was subscribed at another node
	}
	if m.r != nil {
		return m.r.request(ctx, id, msg)
	}
	p := persistence.Partition(id, len(m.state))
	waitUntil := time.Now().Add(m.cfg.RequestWait)
	for {
		changed := m.view.wait()
		var why error
		if e := m.servingEpoch(p); e != 0 {
			v, err := m.n.host.Request(ctx, id, msg)
			if !actors.NotServed(err) {
				return v, Served{Node: m.id, Partition: p, Epoch: e}, err
			}
			why = err
		} else {
			entry := m.view.part(p)
			info, live := m.view.node(entry.Owner)
			switch {
			case entry.Owner == "":
				why = &actors.Error{Kind: actors.KindUnavailable, Msg: fmt.Sprintf("partition %d has no owner yet", p), RetryAfter: time.Second}
			case entry.Owner == m.id && refusedBy(entry, m.storage):
				return nil, Served{}, refusedErr(p, entry, m.storage)
			case entry.Owner == m.id:
				why = &actors.Error{Kind: actors.KindUnavailable, Msg: fmt.Sprintf("partition %d is being taken up or handed off by this node", p), RetryAfter: 200 * time.Millisecond}
			case !live:
				return nil, Served{}, &actors.Error{Kind: actors.KindUnavailable, Msg: fmt.Sprintf("partition %d is unavailable: its node %s is down", p, entry.Owner), RetryAfter: 2 * time.Second}
			case refusedBy(entry, info.Storage):
				return nil, Served{}, refusedErr(p, entry, info.Storage)
			case m.tr.isDown(info.Addr):
				return nil, Served{}, &actors.Error{Kind: actors.KindUnavailable, Msg: fmt.Sprintf("partition %d is unavailable: its node %s does not answer", p, entry.Owner), RetryAfter: time.Second}
			default:
				v, served, err, retry := m.sendTo(ctx, info, id, msg)
				if !retry {
					return v, served, err
				}
				why = err
			}
		}
		if ctx.Err() != nil || time.Now().After(waitUntil) {
			return nil, Served{}, retryLater(why)
		}
		t := time.NewTimer(50 * time.Millisecond)
		select {
		case <-changed:
		case <-t.C:
		case <-ctx.Done():
		}
		t.Stop()
	}
}

// sendTo runs msg on object id at node n: a subscription through
// subscribeRemote, anything else through forward (retry as forward says).
func (m *member) sendTo(ctx context.Context, n NodeInfo, id actors.ObjectID, msg any) (v any, served Served, err error, retry bool) {
	if sub, ok := msg.(actors.KVSubscribe); ok {
		return m.subscribeRemote(ctx, n, id, sub)
	}
	return m.forward(ctx, n, id, msg)
}

// refusedErr is the 503 for partition p, whose owner refuses to serve it from
// a data directory (storage) that is not the one it was served from.
func refusedErr(p uint32, e PartEntry, storage string) error {
	return &actors.Error{Kind: actors.KindUnavailable, RetryAfter: 2 * time.Second,
		Msg: fmt.Sprintf("partition %d is unavailable: its node %s refuses to serve it from data directory %s, not the one it was served from (%s)", p, e.Owner, storage, e.Storage)}
}

// retryLater turns the last reason a request could not be served into its 503.
func retryLater(why error) error {
	var e *actors.Error
	if errors.As(why, &e) && e.Kind == actors.KindUnavailable {
		out := *e
		out.Code = ""
		if out.RetryAfter == 0 {
			out.RetryAfter = 500 * time.Millisecond
		}
		return &out
	}
	return &actors.Error{Kind: actors.KindUnavailable, Msg: "the object's partition is not available now", RetryAfter: 500 * time.Millisecond}
}

// forward sends a request to the node at addr. retry says the request certainly
// did not run (the node does not serve the partition, or the message never left)
// and may be sent again.
func (m *member) forward(ctx context.Context, n NodeInfo, id actors.ObjectID, msg any) (v any, served Served, err error, retry bool) {
	addr := n.Addr
	reply, err := m.tr.call(ctx, n, &wireRequest{Op: opObject, ID: id, Msg: msg, From: m.id})
	if err != nil {
		if errors.Is(err, errNotWire) {
			return nil, Served{}, &actors.Error{Kind: actors.KindInternal, Msg: err.Error()}, false
		}
		if errors.Is(err, errNotSent) {
			m.log.Debug("a request was not sent to its owner node", "to", addr, "err", err)
			return nil, Served{}, &actors.Error{Kind: actors.KindUnavailable, Msg: "the object's node cannot be reached", RetryAfter: time.Second}, true
		}
		m.log.Debug("forwarded request got no reply", "to", addr, "err", err)
		return nil, Served{}, &actors.Error{Kind: actors.KindUnavailable, Msg: "no reply from the object's node in time; a write's outcome is unknown", RetryAfter: time.Second}, false
	}
	if reply.Err != nil && reply.Err.NotOwner {
		return nil, Served{}, reply.Err.err(), true
	}
	return reply.Val, reply.Served, reply.Err.err(), false
}

// requestAsync is request without a goroutine waiting for the reply, for an
// object whose partition this node serves now (the leader, in a replicated
// cluster); it reports false, and never calls done, for any other
// (Node.RequestAsync).
func (m *member) requestAsync(id actors.ObjectID, msg any, done func(any, Served, error)) bool {
	if _, ok := msg.(actors.KVUnsubscribe); ok || actors.ValidateID(id) != nil {
		return false // request looks further, or says what is wrong
	}
	_, started := m.startServed(id, msg, func(v any, s Served, err error) {
		if actors.NotServed(err) {
			done(nil, Served{}, retryLater(err))
			return
		}
		done(v, s, err)
	})
	return started
}

// startServed starts a request for id on this node's host, without a
// goroutine waiting for it, when this node serves id's partition p now (else
// it reports false and never calls done). done gets the reply and what served
// it; actors.NotServed(err) says the partition left this node before the
// object's turn.
func (m *member) startServed(id actors.ObjectID, msg any, done func(any, Served, error)) (p uint32, started bool) {
	p = persistence.Partition(id, len(m.state))
	e := m.servingEpoch(p)
	if e == 0 {
		return p, false
	}
	m.n.host.RequestAsync(id, msg, func(v any, err error) {
		done(v, Served{Node: m.id, Partition: p, Epoch: e}, err)
	})
	return p, true
}

// notServing is this node's refusal of a request for partition p, which it
// does not serve now; in a replicated cluster it names the leader it knows.
func (m *member) notServing(p uint32) error {
	if m.r != nil {
		return m.r.notLeaderErr(p)
	}
	return &notOwnerError{msg: fmt.Sprintf("node %s does not serve partition %d now", m.id, p)}
}

// serveObject answers another node's request for an object (opObject) on
// the connection's reader, without holding a goroutine until the reply
// (actors.Host.RequestAsync), when the object's turns do not block
// (actors.Host.StartsAtOnce); it takes no other op, and leaves any other
// request for an object to a server (serveRemote).
func (m *member) serveObject(req *wireRequest, reply func(*wireReply)) bool {
	if req.Op != opObject || !m.n.host.StartsAtOnce(req.ID) {
		return false
	}
	m.startObject(req, reply)
	return true
}

// startObject starts another node's request for an object; reply (which
// must not block) gets its answer.
func (m *member) startObject(req *wireRequest, reply func(*wireReply)) {
	if err := actors.ValidateID(req.ID); err != nil {
		reply(&wireReply{Err: toWireError(err)})
		return
	}
	p, started := m.startServed(req.ID, req.Msg, func(v any, s Served, err error) {
		if actors.NotServed(err) {
			reply(&wireReply{Err: toWireError(m.notServing(s.Partition))})
			return
		}
		reply(&wireReply{Val: v, Err: toWireError(err), Served: s})
	})
	if !started {
		reply(&wireReply{Err: toWireError(m.notServing(p))})
	}
}

// serveRemote answers a request from another node on a server goroutine
// (opObject only when serveObject left it).
func (m *member) serveRemote(ctx context.Context, req *wireRequest) *wireReply {
	switch req.Op {
	case opObject: // one whose turn may block, on this server (serveObject)
		done := make(chan *wireReply, 1)
		m.startObject(req, func(r *wireReply) { done <- r })
		select {
		case r := <-done:
			return r
		case <-ctx.Done():
			return &wireReply{Err: toWireError(actors.TimedOut(ctx.Err()))}
		}
	case opHandoffBegin, opHandoffChunk, opHandoffEnd:
		return m.serveHandoff(ctx, req)
	case opPing:
		return &wireReply{Boot: m.boot}
	case opSubscribe, opUnsubscribe:
		return m.serveSubscribe(ctx, req)
	case opSubsCheck:
		return m.serveSubsCheck(req)
	case opList:
		return m.serveList(ctx, req)
	}
	return &wireReply{Err: toWireError(&actors.Error{Kind: actors.KindInternal, Msg: fmt.Sprintf("unknown request %d from node %s", req.Op, req.From)})}
}

// reconcileLoop brings this node's local partition states in line with the
// table whenever either changes.
func (m *member) reconcileLoop() {
	tick := time.NewTicker(500 * time.Millisecond)
	defer tick.Stop()
	for {
		changed := m.view.wait()
		m.noteBoots()
		if m.r != nil {
			m.noteLeaveAsked()
			m.r.reconcile()
		} else {
			m.reconcile()
		}
		m.sweepSubs()
		select {
		case <-m.ctx.Done():
			return
		case <-changed:
		case <-m.kick:
		case <-tick.C:
		}
	}
}

// reconcile takes up the partitions the table gives this node, stops serving
// the ones it lost, starts the handoffs the controller asked for, and cleans
// data of partitions others own.
func (m *member) reconcile() {
	s := m.sess.Load()
	m.view.mu.RLock()
	synced := m.view.synced
	m.view.mu.RUnlock()
	if s == nil || !s.valid() || !synced {
		return
	}
	m.noteLeaveAsked()
	_, parts, _, _ := m.view.snapshot()
	var takeUp []uint32
	m.mu.Lock()
	clear(m.refused)
	for i, e := range parts {
		if e.Owner == m.id && refusedBy(e, m.storage) {
			m.refused[uint32(i)] = e.Storage
		}
	}
	m.logRefused()
	for i, e := range parts {
		p := uint32(i)
		st := m.state[p]
		mine := e.Owner == m.id
		switch st {
		case stServing:
			local := m.n.table.epochs[p].Load()
			if !mine || e.Epoch != local || e.Lease != int64(s.lease) {
				if mine && e.Epoch == local-1 {
					continue // our own take-up's write is not in the view yet
				}
				m.events.stopped.add(e.Owner, "stopped serving a partition", "partition", p, "owner", e.Owner, "epoch", e.Epoch)
				m.stopServing(p)
				m.state[p] = stIdle
				if !mine {
					m.stale[p] = true
				}
				continue
			}
			if e.Target != "" && e.Target != m.id && time.Now().After(m.retryAt[p]) {
				m.state[p] = stHandoff
				m.goOwned(func() { m.handoff(p, e) })
			}
		case stIdle:
			if mine && m.refused[p] != "" {
				continue // never served from this data directory (logRefused)
			}
			if mine {
				takeUp = append(takeUp, p)
			} else if m.stale[p] {
				m.state[p] = stCleaning
				m.goOwned(func() { m.clean(p) })
			}
		case stImporting:
			if mine { // the handoff's end was lost, but the table says it is ours
				m.endImport(p)
				takeUp = append(takeUp, p)
			} else if st := m.imports[p]; st == nil || time.Since(st.last) > importTimeout {
				m.log.Warn("gave up a partition handoff that stopped arriving", "partition", p)
				m.endImport(p)
				m.stale[p] = true
			}
		}
	}
	m.mu.Unlock()
	for _, p := range takeUp {
		m.takeUp(p, s)
	}
}

// noteLeaveAsked closes leaveAsked once an operator asked this node to leave.
func (m *member) noteLeaveAsked() {
	if m.view.leaveRequested(m.id) {
		m.askedOnce.Do(func() {
			m.log.Info("an operator asked this node to leave the cluster")
			close(m.leaveAsked)
		})
	}
}

// logRefused logs, once per change, the partitions this node refuses to serve
// (caller holds m.mu).
func (m *member) logRefused() {
	if len(m.refused) == 0 {
		if m.refusedLog != "" {
			m.log.Info("no partition of this node is refused any more (given up, or served from this data directory again)")
			m.refusedLog = ""
		}
		return
	}
	expected := map[string]bool{}
	for _, id := range m.refused {
		expected[id] = true
	}
	var exp []string
	for id := range expected {
		exp = append(exp, id)
	}
	sort.Strings(exp)
	msg := fmt.Sprintf("%d/%s", len(m.refused), strings.Join(exp, ","))
	if msg == m.refusedLog {
		return
	}
	m.refusedLog = msg
	m.log.Error("this node's data directory is not the one its partitions were served from: refusing to serve them; restore the node's data directory and restart it, or give them up (their data is lost) with: holdfast cluster forget-node "+m.id+" --accept-data-loss",
		"nodeId", m.id, "partitions", len(m.refused), "expectedStorageId", strings.Join(exp, ","), "foundStorageId", m.storage, "dataDir", m.n.cfg.DataDir)
}

// noteBoots forgets a lost connection to a node's address once the node
// registered again (a new boot): it restarted and can be reached.
func (m *member) noteBoots() {
	nodes, _, _, _ := m.view.snapshot()
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.boots == nil {
		m.boots = map[string]string{}
	}
	for id, n := range nodes {
		if b, ok := m.boots[id]; ok && b != n.Boot {
			m.tr.clearDown(n.Addr)
		}
		m.boots[id] = n.Boot
	}
}

// importTimeout is how long an import waits for its next chunk.
const importTimeout = time.Minute

// takeUp starts serving partition p under this node's lease: the table's epoch
// goes up by one, by compare-and-swap, and the node serves at the new epoch.
func (m *member) takeUp(p uint32, s *session) {
	e, err := readPart(m.ctx, m.cli, m.k, p)
	if err != nil || e.Owner != m.id {
		return
	}
	if refusedBy(e, m.storage) {
		return // served from another data directory: reconcile logs it
	}
	next := e
	next.Epoch = e.Epoch + 1
	next.Lease = int64(s.lease)
	next.Storage = m.storage
	if err := casPart(m.ctx, m.cli, m.k, p, e, next); err != nil {
		return // the next reconcile looks again
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.sess.Load() != s || m.state[p] != stIdle && m.state[p] != stImporting {
		return
	}
	m.aux[p].Store(0)
	m.stale[p] = false
	m.n.table.losses[p].Store(next.Losses)
	m.n.table.epochs[p].Store(next.Epoch)
	m.state[p] = stServing
	m.n.host.TakeUp(p)
	m.log.Debug("serving a partition", "partition", p, "epoch", next.Epoch)
}

// nextAux returns a fresh epoch for this node's own import or cleanup writes.
func (m *member) nextAux() uint64 { return 1<<63 | m.auxSeq.Add(1) }

// clean deletes this node's data of partition p, which another node owns.
func (m *member) clean(p uint32) {
	// The view may lag behind etcd: a partition this node was handed, whose
	// switch it has not seen yet, must keep its data.
	if e, err := readPart(m.ctx, m.cli, m.k, p); err != nil || e.Owner == m.id {
		m.mu.Lock()
		defer m.mu.Unlock()
		if m.state[p] == stCleaning {
			m.state[p] = stIdle
			if err == nil {
				m.stale[p] = false
			}
		}
		return
	}
	aux := m.nextAux()
	m.aux[p].Store(aux)
	err := m.deletePartition(m.ctx, p, aux, func() bool {
		m.mu.Lock()
		defer m.mu.Unlock()
		return m.state[p] == stCleaning
	})
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.aux[p].Load() == aux {
		m.aux[p].Store(0)
	}
	if m.state[p] != stCleaning {
		return
	}
	m.state[p] = stIdle
	if err == nil {
		m.stale[p] = false
		m.log.Debug("deleted the data of a partition owned elsewhere", "partition", p)
	} else if m.ctx.Err() == nil {
		m.log.Warn("cannot delete the data of a partition owned elsewhere; retrying later", "partition", p, "err", err)
	}
}

// deletePartition deletes every key of partition p through the pipeline, in
// chunks, with writes tagged aux; it stops early when keepOn says so.
func (m *member) deletePartition(ctx context.Context, p uint32, aux uint64, keepOn func() bool) error {
	prefix := persistence.PartitionPrefix(p)
	for keepOn() {
		var dels [][]byte
		size := 0
		err := m.n.db.Scan(ctx, prefix, nil, nil, func(k, _ []byte) (bool, error) {
			dels = append(dels, append([]byte(nil), k...))
			size += len(k)
			return len(dels) < 4096 && size < 1<<20, nil
		})
		if err != nil {
			return err
		}
		if len(dels) == 0 {
			return nil
		}
		t := m.n.pipe.Submit(&persistence.Write{Partition: p, Epoch: aux, Deletes: dels})
		if err := t.Wait(ctx); err != nil {
			return err
		}
		if err := m.n.pipe.WaitApplied(ctx); err != nil {
			return err
		}
	}
	return errors.New("stopped")
}

// stop ends the member: background work stops, the lease is revoked (a
// graceful stop) or left to expire (revoke false), and the transport closes.
func (m *member) stop(revoke bool) {
	m.cancel()
	if s := m.sess.Load(); s != nil && revoke {
		s.revoke()
	}
	_ = m.owned.Wait(context.Background()) // every loop ends with m.ctx
	m.tr.stop()
	if m.events != nil {
		m.events.stop()
	}
	_ = m.cli.Close()
}

// leave hands every partition of this node to the others (graceful leave):
// the node marks itself leaving, the controller gives each of its partitions a
// target, and the node hands them off. It returns once the node owns none, or
// when no other node can take them, or when ctx ends.
func (m *member) leave(ctx context.Context) error {
	if !m.leaving.CompareAndSwap(false, true) {
		return nil
	}
	s := m.sess.Load()
	if s == nil {
		return errors.New("not registered")
	}
	b, _ := json.Marshal(m.info(s))
	pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	_, err := m.cli.Put(pctx, m.k.node(m.id), string(b), clientv3.WithLease(s.lease))
	cancel()
	if err != nil {
		return fmt.Errorf("mark the node leaving: %w", err)
	}
	if m.r != nil {
		return m.r.leave(ctx)
	}
	m.log.Info("leaving the cluster: handing partitions off")
	start := time.Now()
	for {
		changed := m.view.wait()
		nodes, parts, _, _ := m.view.snapshot()
		// A refused partition cannot be handed off (this node does not hold
		// its data): it stays, waiting for its data directory.
		var owned []uint32
		for _, p := range ownedBy(parts, m.id) {
			if !refusedBy(parts[p], m.storage) {
				owned = append(owned, p)
			}
		}
		others := 0
		for _, n := range nodes {
			if n.ID != m.id && !n.Client && !n.Leaving {
				others++
			}
		}
		if len(owned) == 0 {
			m.log.Info("left the cluster: every partition handed off", "took", time.Since(start).Round(time.Millisecond))
			dctx, cancel := context.WithTimeout(ctx, 3*time.Second)
			_, _ = m.cli.Delete(dctx, m.k.leave(m.id)) // the request is done
			cancel()
			return nil
		}
		if others == 0 {
			return fmt.Errorf("no other node can take this node's %d partitions; they stay unavailable until it returns", len(owned))
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%d partitions not handed off: %w", len(owned), ctx.Err())
		case <-changed:
		case <-time.After(200 * time.Millisecond):
		}
	}
}
