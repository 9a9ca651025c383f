package cluster

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"go.etcd.io/raft/v3/raftpb"

	"github.com/holdfast/holdfast/actors"
	"github.com/holdfast/holdfast/persistence"
	"github.com/holdfast/holdfast/replication"
)

// The raft half of a member of a replicated cluster (replicationFactor > 1;
// docs/replication-design.md, step 4). Every partition is a raft group of
// replicationFactor replicas on different nodes, placed by the controller in
// etcd (groups/<p>, GroupEntry). The node's database is opened replicated:
// its write-ahead log carries the raft entries of every group it has a
// replica of (replication.WALPipeline), and committed entries reach its
// Badger through the same applier as a single node's writes.
//
// Serving: a node serves partition p while its replica of p's group holds
// the leader lease (Engine.LeaseValid): the host's epoch of p is then the
// raft term, and every write the activation makes carries it, so a write
// proposed in a later term is refused (replication.Proposer). The lease
// lapses before any other replica can be elected, so two nodes never serve
// p at once; a message handled after the lease lapsed finds the epoch moved
// and the activation is dropped. etcd plays no part in serving: a node cut
// off from etcd keeps serving what it leads, and a node cut off from its
// peers stops within its lease.
//
// Routing: a request for p goes to the node this node believes leads p (its
// own replica's view of the leader, or the hint the last refusal carried),
// which refuses it with a hint when it does not serve p; the request waits
// for an election for at most RequestWait.
//
// Storage identity: a replica runs only on the data directory it was placed
// on (ReplicaEntry.Storage). A node back with a new or another directory
// (a wiped disk, a reused nodeId) runs none of its old replicas: they never
// vote with a log they forgot.
//
// Not built yet (design step 4 continues): moving replicas (join, leave,
// repair after replaceAfter), which needs snapshots over the WAL; leadership
// balancing by transfer; cluster status per partition; recover-partition.
// A cluster forms its groups once replicationFactor nodes are live.
type replicated struct {
	m    *member
	rf   int
	num  replication.NodeID
	tick time.Duration

	db      *persistence.DB
	wp      *replication.WALPipeline
	carrier *replication.TCPCarrier
	tr      *replication.NetTransport
	e       *replication.Engine
	prop    *replication.Proposer
	// raftAddr is the address other nodes reach the carrier at.
	raftAddr string

	mu sync.Mutex
	// local maps the groups this node runs a replica of to the replica.
	local map[uint32]replication.ReplicaID
	// peers is the address book as last given to the transport.
	peers map[replication.NodeID]NodeInfo
	// failed names groups whose replica could not start (logged once).
	failed map[uint32]string
	// names maps raft node numbers to node ids (any goroutine).
	names atomic.Pointer[map[uint64]string]
	// serving is the term each partition was last seen served at, by
	// servingLoop only.
	serving []uint64
	// hints is the node each partition was last said to be led by (a
	// refusal's hint), for nodes that have no replica of it.
	hints []atomic.Pointer[string]
	// waitingLogged: the controller said once that it waits for nodes.
	waitingLogged bool
	// removing holds the replicas reconcile asked the engine to stop.
	removing map[uint32]replication.ReplicaID
	// retired holds the replicas that left their group for good (removed by
	// a move, stopped by reconcile) whose logs reconcile has yet to end
	// (WALPipeline.Forget).
	retired [][2]uint64
	// ended holds every replica that left its group on this node in this
	// run (onRemoved): the table may list one a while longer (until the
	// move's leader settles the entry), and reconcile must not start it
	// again on a log Forget ends under it (raft failed the group: found by
	// TestReplicated_ProcessesDownPastReplaceAfter). Replica ids are never
	// reused within a group, so the set only grows, by one per removal.
	ended map[[2]uint64]bool
	// lostLogged is the count of lost replicas last logged (reconcile).
	lostLogged int
	// unformedSince is when the controller first saw partitions without a
	// group (controller only).
	unformedSince time.Time
	// downSince is when the controller first saw each node with replicas
	// down (controller only).
	downSince map[string]time.Time
}

// newReplicated opens the raft half of node n, raft node number num, over
// its replicated database and started pipeline: the WAL pipeline, the
// carrier (listening), the transport and the engine, none of them started.
func newReplicated(n *Node, cc ClusterConfig, rf int, num uint64) (*replicated, error) {
	timeout := cc.FailoverTimeout
	if timeout == 0 {
		timeout = time.Second
	}
	const electionTicks = 10
	r := &replicated{
		rf: rf, db: n.db, num: replication.NodeID(num), tick: timeout / electionTicks,
		downSince: map[string]time.Time{}, removing: map[uint32]replication.ReplicaID{},
		local: map[uint32]replication.ReplicaID{}, ended: map[[2]uint64]bool{}, peers: map[replication.NodeID]NodeInfo{}, failed: map[uint32]string{},
		serving: make([]uint64, n.db.Partitions()), hints: make([]atomic.Pointer[string], n.db.Partitions()),
	}
	r.names.Store(&map[uint64]string{})
	bind, adv, err := raftAddrs(cc)
	if err != nil {
		return nil, err
	}
	log := n.log.With("node", cc.NodeID)
	r.wp = replication.NewWALPipeline(n.db, n.pipe, replication.WALConfig{Logger: log})
	if r.carrier, err = replication.ListenTCP(replication.TCPConfig{Bind: bind, Logger: log}); err != nil {
		r.wp.Close()
		return nil, fmt.Errorf("cluster: raft carrier: %w", err)
	}
	r.raftAddr = adv
	if host, port, _ := net.SplitHostPort(adv); port == "0" {
		_, lport, _ := net.SplitHostPort(r.carrier.Addr())
		r.raftAddr = net.JoinHostPort(host, lport)
	}
	onBeat := func(g replication.GroupID, from replication.ReplicaID, sent time.Time) {
		if e := r.e; e != nil {
			e.OnBeatAck(g, from, sent)
		}
	}
	if r.tr, err = replication.NewNetTransport(replication.NetConfig{Node: r.num, Storage: n.storageID, BeatInterval: r.tick / 2, OnBeatAck: onBeat,
		Snapshots: r.wp, SnapshotSink: r.wp, Logger: log}, r.carrier); err == nil {
		r.carrier.SetHandler(r.tr.HandleFrame)
		r.e, err = replication.New(replication.Config{Node: r.num, TickInterval: r.tick, ElectionTick: electionTicks, Logger: log}, r.tr, r.wp)
	}
	if err != nil {
		r.close()
		return nil, err
	}
	r.prop = replication.NewProposer(r.e, n.pipe)
	return r, nil
}

// raftAddrs derives the carrier's listen and advertised addresses:
// raftAdvertise defaults to advertise's host with the port above; raftBind
// to bind's host (advertise's when bind is empty) with raftAdvertise's port
// if that was set, else the port above bind's. Port 0 stays 0 (tests).
func raftAddrs(cc ClusterConfig) (bind, advertise string, err error) {
	portAbove := func(addr string) (string, string, error) {
		host, port, err := net.SplitHostPort(addr)
		if err != nil {
			return "", "", fmt.Errorf("cluster: address %q: %w", addr, err)
		}
		n, err := strconv.Atoi(port)
		if err != nil || n < 0 || n >= 65535 {
			return "", "", fmt.Errorf("cluster: address %q: no port above it for the raft carrier; set cluster.raftAdvertise", addr)
		}
		if n == 0 {
			return host, "0", nil
		}
		return host, strconv.Itoa(n + 1), nil
	}
	advertise = cc.RaftAdvertise
	if advertise == "" {
		host, port, err := portAbove(cc.Advertise)
		if err != nil {
			return "", "", err
		}
		advertise = net.JoinHostPort(host, port)
	}
	bind = cc.RaftBind
	if bind == "" {
		from := cmp.Or(cc.Bind, cc.Advertise)
		host, port, err := portAbove(from)
		if err != nil {
			return "", "", err
		}
		if cc.RaftAdvertise != "" {
			if _, p, err := net.SplitHostPort(cc.RaftAdvertise); err == nil {
				port = p
			}
		}
		bind = net.JoinHostPort(host, port)
	}
	return bind, advertise, nil
}

// start starts the transport and the engine; groups join as reconcile finds
// them in the table.
func (r *replicated) start() error {
	if err := r.tr.Start(r.e); err != nil {
		return err
	}
	return r.e.Start()
}

// close stops the engine, the transport, the carrier and the WAL pipeline
// (not the persistence pipeline or the database: the node's).
func (r *replicated) close() {
	if r.e != nil {
		_ = r.e.Close()
	}
	if r.tr != nil {
		_ = r.tr.Close()
	}
	_ = r.carrier.Close()
	r.wp.Close()
}

// epoch is partition p's serving epoch: the raft term while this node's
// replica holds p's leader lease, else 0.
func (r *replicated) epoch(p uint32) uint64 {
	if r.e == nil {
		return 0
	}
	if term, ok := r.e.LeaseValid(replication.GroupID(p)); ok {
		return term
	}
	return 0
}

// served lists the partitions this node serves now.
func (r *replicated) served() []uint32 {
	var out []uint32
	for _, g := range r.e.Groups() {
		if r.epoch(uint32(g)) != 0 {
			out = append(out, uint32(g))
		}
	}
	return out
}

// nameOf returns the node id of raft node number num ("" if unknown).
func (r *replicated) nameOf(num replication.NodeID) string { return (*r.names.Load())[uint64(num)] }

// leader returns the node id this node believes leads p, or "".
func (r *replicated) leader(p uint32) string {
	if r.e != nil {
		if st, err := r.e.Status(replication.GroupID(p)); err == nil {
			if st.Leader != 0 {
				return r.nameOf(st.Leader)
			}
			return ""
		}
	}
	if h := r.hints[p].Load(); h != nil {
		return *h
	}
	return ""
}

// hint records that p is led by node id (a refusal said so).
func (r *replicated) hint(p uint32, id string) {
	if id == "" {
		r.hints[p].Store(nil)
		return
	}
	r.hints[p].Store(&id)
}

// reconcile brings the transport's address book and the engine's groups in
// line with the table: every live node's raft address, and a replica for
// every group entry that places one on this node's data directory.
func (r *replicated) reconcile() {
	m := r.m
	r.forgetRetired()
	nodes, _, _, _ := m.view.snapshot()
	groups := m.view.groupsSnapshot()
	names := map[uint64]string{}
	r.mu.Lock()
	defer r.mu.Unlock()
	for i, g := range groups {
		// Before any replica of the group starts here: an object that
		// writes after a recovery numbers its log_ids above every one the
		// lost replicas may have issued (actors/logfloor.go).
		m.n.table.losses[i].Store(g.Losses)
	}
	for id, n := range nodes {
		if n.Num == 0 || n.Raft == "" {
			continue
		}
		names[n.Num] = id
		num := replication.NodeID(n.Num)
		if old, ok := r.peers[num]; ok && old.Raft == n.Raft && old.Storage == n.Storage {
			continue
		}
		r.peers[num] = n
		if num != r.num {
			r.carrier.SetAddr(num, n.Raft)
			r.tr.SetPeer(num, n.Storage)
		}
	}
	// A node that is down keeps its number's name: replicas name it.
	for num, n := range r.peers {
		if _, ok := names[uint64(num)]; !ok {
			names[uint64(num)] = n.ID
		}
	}
	for _, g := range groups {
		for _, rep := range g.Replicas {
			if _, ok := names[rep.Num]; !ok {
				names[rep.Num] = rep.Node
			}
		}
	}
	r.names.Store(&names)
	lost := 0 // replicas placed on this node's previous data directory
	for i, g := range groups {
		p := uint32(i)
		for _, rep := range g.Replicas {
			if rep.Node == m.id && rep.Storage != m.storage {
				lost++
			}
		}
		if rid, ok := r.local[p]; ok && len(g.Replicas) > 0 {
			if me, placed := g.replicaOn(m.id, m.storage); !placed || replication.ReplicaID(me.ID) != rid {
				// The group removed this replica (a move settled) and it
				// never learned it: stop it (OnRemoved forgets it).
				if r.removing[p] != rid {
					r.removing[p] = rid
					m.log.Info("stopping a replica its group no longer has", "partition", p, "replica", uint64(rid))
					_ = r.e.RemoveGroup(replication.GroupID(p))
				}
			}
		}
		if _, ok := r.local[p]; ok || len(g.Replicas) == 0 {
			continue
		}
		me, ok := g.replicaOn(m.id, m.storage)
		if !ok || r.ended[[2]uint64{uint64(p), me.ID}] {
			continue
		}
		if err := r.addGroup(p, g, me); err != nil {
			if r.failed[p] != err.Error() {
				r.failed[p] = err.Error()
				m.log.Error("cannot start a partition's replica", "partition", p, "replica", me.ID, "err", err)
			}
			continue
		}
		delete(r.failed, p)
		r.local[p] = replication.ReplicaID(me.ID)
	}
	if lost != r.lostLogged {
		r.lostLogged = lost
		if lost > 0 {
			m.log.Error("this node's data directory is not the one some of its replicas were placed on: those replicas are lost and never run; the cluster re-creates them from the other replicas (new, empty replicas here, filled by snapshot)",
				"nodeId", m.id, "lostReplicas", lost, "storageId", m.storage, "dataDir", m.n.cfg.DataDir)
		} else {
			m.log.Info("no replica of this node is placed on another data directory any more")
		}
	}
}

// recoveredTerm is the lowest term a group recovered for the losses-th time
// starts at: terms (the serving epochs) of the lost replicas are below it,
// as long as a group holds fewer than 2^40 elections between recoveries, so
// no epoch is served twice; it stays below 2^53 (JSON numbers) for 2^13
// recoveries of one partition.
func recoveredTerm(losses uint64) uint64 { return min(losses, 1<<13-1) << 40 }

// addGroup starts this node's replica me of partition p's group g: a
// founder bootstraps its log with the founding voters the first time.
func (r *replicated) addGroup(p uint32, g GroupEntry, me ReplicaEntry) error {
	gid, rid := replication.GroupID(p), replication.ReplicaID(me.ID)
	peers := map[replication.ReplicaID]replication.NodeID{}
	cs := &raftpb.ConfState{}
	for _, rep := range g.Replicas {
		peers[replication.ReplicaID(rep.ID)] = replication.NodeID(rep.Num)
		if rep.Founder {
			cs.Voters = append(cs.Voters, rep.ID)
		}
	}
	if me.RecoverFrom != 0 {
		// recover-partition: this replica starts as the group's only voter,
		// from the log of the replica that survived here.
		ctx, cancel := context.WithTimeout(r.m.ctx, time.Minute)
		last, err := r.wp.Reseed(ctx, gid, replication.ReplicaID(me.RecoverFrom), rid, recoveredTerm(g.Losses))
		if err == nil {
			err = r.wp.Forget(ctx, gid, replication.ReplicaID(me.RecoverFrom))
		}
		cancel()
		if err != nil {
			return fmt.Errorf("recover partition %d from replica %d: %w", p, me.RecoverFrom, err)
		}
		r.m.log.Warn("partition recovered from a minority: its replica here restarts as the only voter, from what this node held; writes only the lost replicas held are gone", "partition", p, "replica", me.ID, "from", me.RecoverFrom, "logEnd", last, "losses", g.Losses)
	} else if me.Founder {
		if last, _ := r.db.RaftStorage(uint64(p), me.ID, nil).LastIndex(); last == 0 {
			ctx, cancel := context.WithTimeout(r.m.ctx, 10*time.Second)
			err := r.wp.Bootstrap(ctx, gid, rid, cs)
			cancel()
			if err != nil {
				return err
			}
		}
	}
	st, applied, err := r.wp.Storage(gid, rid)
	if err != nil {
		return err
	}
	return r.e.AddGroup(replication.GroupConfig{ID: gid, Replica: rid, Peers: peers, Storage: st, Applied: applied, OnRemoved: r.onRemoved})
}

// servingLoop follows the leases of this node's replicas: a partition whose
// replica gained the lease is taken up (queue replay, alarms), one that lost
// it is dropped (its activations go at once rather than at their next
// message). Serving itself needs no loop: the host reads epoch on every
// message.
func (r *replicated) servingLoop() {
	t := time.NewTicker(max(r.tick/2, 5*time.Millisecond))
	defer t.Stop()
	host := r.m.n.host
	stuck := map[uint32]time.Time{} // led without the lease since
	for {
		select {
		case <-r.m.ctx.Done():
			return
		case <-t.C:
		}
		gained, lost := 0, 0
		for _, g := range r.e.Groups() {
			p := uint32(g)
			now, prev := r.epoch(p), r.serving[p]
			r.unstick(g, now != 0, stuck)
			if now == prev {
				continue
			}
			r.serving[p] = now
			if prev != 0 {
				host.DropPartition(p)
				lost++
			}
			if now != 0 {
				host.TakeUp(p)
				gained++
			}
			r.m.log.Debug("partition leadership changed", "partition", p, "term", now, "was", prev)
		}
		if lost > 0 && gained == 0 {
			host.Scheduler().Reset()
		}
	}
}

// stuckAfter is how long, in election timeouts, a replica may lead without
// the lease before it hands the leadership to another replica.
const stuckAfter = 3

// unstick hands group g to another replica when this replica has led it
// without the lease for stuckAfter election timeouts. A lease normally
// comes within a heartbeat round of an election; what keeps it off for good
// is a transfer abandoned because its transferee stopped answering (the
// lease waits for that replica's ack, so that a late MsgTimeoutNow cannot
// elect it behind the lease: replication/lease.go). Raft has no way to step
// down at will, but a transfer to a replica that answers ends the term, and
// with it the danger.
func (r *replicated) unstick(g replication.GroupID, serving bool, stuck map[uint32]time.Time) {
	p := uint32(g)
	st, err := r.e.Status(g)
	if serving || err != nil || !st.IsLeader {
		delete(stuck, p)
		return
	}
	since, ok := stuck[p]
	if !ok {
		stuck[p] = time.Now()
		return
	}
	if time.Since(since) < stuckAfter*10*r.tick {
		return
	}
	stuck[p] = time.Now() // at most one attempt per stuckAfter timeouts
	for _, rep := range r.m.view.group(p).Replicas {
		to := replication.ReplicaID(rep.ID)
		if to == st.Replica || !r.e.Responsive(g, to, responsiveWithin(r.tick)) {
			continue
		}
		r.m.log.Warn("leading a partition without the lease for too long; handing it to another replica", "partition", p, "to", rep.Node)
		r.m.goOwned(func() {
			ctx, cancel := context.WithTimeout(r.m.ctx, 20*r.tick)
			defer cancel()
			_ = r.e.TransferLeader(ctx, g, to)
		})
		return
	}
}

// placeGroups is the controller's pass in a replicated cluster: every
// partition without a group gets one, once replicationFactor eligible nodes
// are live (or, after formAfter, with the nodes that are: the groups grow as
// more join, moves.go), its replicas spread over them in turn (partition p's
// first replica on the p-th node, the next ones on the following nodes), so
// that each node holds about as many replicas, and first replicas, as the
// others.
func (r *replicated) placeGroups() error {
	m := r.m
	nodes, _, _, _ := m.view.snapshot()
	groups := m.view.groupsSnapshot()
	missing := 0
	for _, g := range groups {
		if len(g.Replicas) == 0 {
			missing++
		}
	}
	if missing == 0 {
		return r.planMoves()
	}
	var eligible []NodeInfo
	for _, id := range sortedIDs(nodes) {
		n := nodes[id]
		if !n.Client && !n.Leaving && n.Num != 0 && n.Raft != "" && n.Storage != "" {
			eligible = append(eligible, n)
		}
	}
	if r.unformedSince.IsZero() {
		r.unformedSince = time.Now()
	}
	size := min(r.rf, len(eligible))
	if size == 0 || size < r.rf && time.Since(r.unformedSince) < m.cfg.formAfter {
		if !r.waitingLogged {
			r.waitingLogged = true
			m.log.Info("waiting for nodes to form the cluster's replicated partitions", "live", len(eligible), "replicationFactor", r.rf, "formsAnywayAfter", m.cfg.formAfter)
		}
		return nil
	}
	placed := 0
	for i, g := range groups {
		if len(g.Replicas) != 0 {
			continue
		}
		ne := GroupEntry{Next: uint64(size) + 1}
		for j := range size {
			n := eligible[(i+j)%len(eligible)]
			ne.Replicas = append(ne.Replicas, ReplicaEntry{ID: uint64(j + 1), Node: n.ID, Num: n.Num, Storage: n.Storage, Founder: true})
		}
		if err := casGroup(m.ctx, m.cli, m.k, uint32(i), g, ne); err != nil {
			return err
		}
		placed++
	}
	m.log.Info("formed the cluster's replicated partitions", "partitions", placed, "nodes", len(eligible), "replicas", size, "replicationFactor", r.rf)
	return nil
}

// notLeaderErr is a replica's refusal of a request for p, which it does not
// serve now, with the node it believes leads p.
func (r *replicated) notLeaderErr(p uint32) error {
	lead := r.leader(p)
	if lead == r.m.id {
		lead = "" // elected, the lease not yet held: ask again
	}
	return &notOwnerError{msg: fmt.Sprintf("node %s does not serve partition %d now", r.m.id, p), leader: lead}
}

// request runs msg on object id on the node that leads its partition,
// waiting out an election for at most RequestWait. Where to send it, in
// order: this node if it serves the partition; the leader its own replica
// knows; the leader the last refusal named; then the group's other replicas
// in turn (a replica that does not lead refuses with the leader it knows).
// A node that refused this request, or did not answer, is skipped for it,
// so that a replica with a stale view (cut off, just restarted, or on a
// wiped disk) cannot keep it waiting.
func (r *replicated) request(ctx context.Context, id actors.ObjectID, msg any) (any, Served, error) {
	m := r.m
	p := persistence.Partition(id, len(m.state))
	waitUntil := time.Now().Add(m.cfg.RequestWait)
	skip := map[string]bool{} // nodes tried in this round
	attempt := 0
	for ; ; attempt++ {
		var why error
		if e := r.epoch(p); e != 0 {
			v, err := m.n.host.Request(ctx, id, msg)
			if !actors.NotServed(err) {
				return v, Served{Node: m.id, Partition: p, Epoch: e}, err
			}
			why = err
		} else if g := m.view.group(p); len(g.Replicas) == 0 {
			why = &actors.Error{Kind: actors.KindUnavailable, Msg: fmt.Sprintf("partition %d is not formed yet: the cluster waits for %d nodes", p, r.rf), RetryAfter: time.Second}
		} else {
			target := r.route(p, g, skip, attempt)
			info, live := m.view.node(target)
			switch {
			case target == "":
				why = &actors.Error{Kind: actors.KindUnavailable, Msg: fmt.Sprintf("partition %d has no leader now (an election is under way)", p), RetryAfter: 200 * time.Millisecond}
				clear(skip) // a new round: everyone may know more now
			case target == m.id:
				why = &actors.Error{Kind: actors.KindUnavailable, Msg: fmt.Sprintf("partition %d is being taken up by this node", p), RetryAfter: 100 * time.Millisecond}
				skip[target] = true
			case !live || m.tr.isDown(info.Addr):
				why = &actors.Error{Kind: actors.KindUnavailable, Msg: fmt.Sprintf("partition %d's leader %s does not answer; waiting for an election", p, target), RetryAfter: 500 * time.Millisecond}
				skip[target] = true
				r.hint(p, "")
			default:
				v, served, err, retry := m.sendTo(ctx, info, id, msg)
				if !retry {
					return v, served, err
				}
				skip[target] = true
				var no *notOwnerError
				if errors.As(err, &no) && no.leader != target {
					r.hint(p, no.leader)
					if no.leader != "" {
						delete(skip, no.leader) // follow the news at once
					}
				}
				why = err
			}
		}
		if ctx.Err() != nil || time.Now().After(waitUntil) {
			return nil, Served{}, retryLater(why)
		}
		sleep(ctx, 20*time.Millisecond)
	}
}

// route picks the node to send a request for p to (see request), or "" when
// every candidate was tried in this round.
func (r *replicated) route(p uint32, g GroupEntry, skip map[string]bool, attempt int) string {
	ok := func(id string) bool { return id != "" && !skip[id] }
	if r.e != nil {
		if st, err := r.e.Status(replication.GroupID(p)); err == nil && st.Leader != 0 {
			if id := r.nameOf(st.Leader); ok(id) {
				return id
			}
		}
	}
	if h := r.hints[p].Load(); h != nil && ok(*h) {
		return *h
	}
	for i := range g.Replicas {
		rep := g.Replicas[(attempt+i)%len(g.Replicas)]
		if rep.Node != r.m.id && ok(rep.Node) {
			return rep.Node
		}
	}
	return ""
}

// leaveSettle is how long a leaving node's replicas must stay gone from the
// table before it stops (leave).
var leaveSettle = time.Second

// leave moves this node's replicas to other nodes before it stops (a
// graceful stop or `holdfast cluster leave`): the controller moves them once
// the node is marked leaving. With too few other nodes to take them, it
// hands the leadership of every group it leads to a replica on a live node
// that is not leaving, so that its partitions are served elsewhere, and its
// replicas stay (the groups are a replica short while it is away).
func (r *replicated) leave(ctx context.Context) error {
	m := r.m
	// The controller moves this node's replicas away (moves.go) if enough
	// other nodes can take them: wait for that first.
	var emptySince time.Time
	for start := time.Now(); ; {
		changed := m.view.wait()
		nodes, _, _, _ := m.view.snapshot()
		others := 0
		for id, n := range nodes {
			if id != m.id && !n.Client && !n.Leaving && n.Num != 0 {
				others++
			}
		}
		held := 0
		for _, g := range m.view.groupsSnapshot() {
			if _, ok := g.replicaOn(m.id, m.storage); ok {
				held++
			}
		}
		// None held for leaveSettle: a controller that planned a move before
		// it saw this node leaving (the emptiest node, once it gave its
		// replicas away) can still place one here a moment after the last
		// left; it is moved away again, since the node is leaving now. (Once
		// in CI, loaded: the leave returned with none held, and a replica
		// appeared on the node after it stopped, and stayed.)
		switch {
		case held > 0:
			emptySince = time.Time{}
		case emptySince.IsZero():
			emptySince = time.Now()
		case time.Since(emptySince) >= leaveSettle:
			m.log.Info("left the cluster: every replica moved to other nodes", "took", time.Since(start).Round(time.Millisecond))
			return nil
		}
		if held > 0 && others < r.rf {
			m.log.Info("leaving the cluster: too few other nodes to take this node's replicas; handing leaderships over only", "replicas", held, "otherNodes", others, "replicationFactor", r.rf)
			break
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%d replicas not moved away: %w", held, ctx.Err())
		case <-changed:
		case <-time.After(200 * time.Millisecond):
		}
	}
	nodes, _, _, _ := m.view.snapshot()
	var wg sync.WaitGroup
	var failed atomic.Int64
	sem := make(chan struct{}, 32)
	led := 0
	load := r.leaderCounts()
	for _, g := range r.e.Groups() {
		st, err := r.e.Status(g)
		if err != nil || !st.IsLeader {
			continue
		}
		led++
		// To the responsive replica on the live node that leads the fewest
		// groups.
		to, toNode := replication.ReplicaID(0), ""
		for _, rep := range m.view.group(uint32(g)).Replicas {
			n, live := nodes[rep.Node]
			if rep.Node == m.id || !live || n.Leaving || n.Storage != rep.Storage ||
				!r.e.Responsive(g, replication.ReplicaID(rep.ID), responsiveWithin(r.tick)) {
				continue
			}
			if to == 0 || load[rep.Node] < load[toNode] {
				to, toNode = replication.ReplicaID(rep.ID), rep.Node
			}
		}
		if to == 0 {
			failed.Add(1)
			continue
		}
		load[toNode]++
		wg.Add(1)
		sem <- struct{}{}
		go func() { // owned here: leave waits for every transfer
			defer wg.Done()
			defer func() { <-sem }()
			if err := r.e.TransferLeader(ctx, g, to); err != nil {
				failed.Add(1)
			}
		}()
	}
	wg.Wait()
	if n := failed.Load(); n > 0 {
		return fmt.Errorf("%d of the %d partitions this node led could not be handed to another replica", n, led)
	}
	m.log.Info("left the cluster's leaderships to other replicas", "partitions", led)
	return nil
}

// responsiveWithin is how recent a replica's last heartbeat acknowledgement
// must be for it to take a leadership: a few heartbeat intervals (half a
// tick each).
func responsiveWithin(tick time.Duration) time.Duration { return 3 * tick }

// leaderCounts counts, over the groups this node has a replica of, the
// groups each node leads as this node's replicas see it.
func (r *replicated) leaderCounts() map[string]int {
	out := map[string]int{}
	for _, g := range r.e.Groups() {
		if st, err := r.e.Status(g); err == nil && st.Leader != 0 {
			out[r.nameOf(st.Leader)]++
		}
	}
	return out
}

// Leadership balancing. Placement rotates each group's first replica over
// the nodes, so "every group led by its first replica" spreads the leaders
// evenly; elections ignore it (the first replica to time out wins). Every
// balanceEvery the leader of a group whose first replica is on another live
// node, not leaving, on the data directory it was placed on, hands the
// group over, a few at a time. A transfer ends the lease at once and, if the
// transferee does not take over (it is cut off, or far behind), raft gives
// up after an election timeout and the group is unserved meanwhile: so a
// group whose transfer failed is not tried again for balanceBackoff.
//
// A pass that handed over balanceAtOnce groups, every one of them taken
// over, is followed by the next one after balanceAgain rather than
// balanceEvery: a node back from a restart is owed a third of the groups (86
// of 256), and at 4 per node every 2 s it led them all again only 24-30 s
// after its start (docs/benchmarks.md, failover). At most balanceAtOnce
// transfers per node are still under way at once, and the first failure
// brings the pace back to balanceEvery.
const (
	balanceEvery   = 2 * time.Second
	balanceAgain   = 100 * time.Millisecond
	balanceBackoff = 30 * time.Second
	balanceAtOnce  = 4
)

// balanceLoop runs the balancing passes until the member stops.
func (r *replicated) balanceLoop() {
	t := time.NewTimer(balanceEvery)
	defer t.Stop()
	next := map[replication.GroupID]time.Time{}
	for {
		select {
		case <-r.m.ctx.Done():
			return
		case <-t.C:
		}
		wait := balanceEvery
		if !r.m.leaving.Load() && r.balance(next) {
			wait = balanceAgain
		}
		t.Reset(wait)
	}
}

// balance runs one pass: it hands at most balanceAtOnce groups to their
// first replica and waits for the transfers to end. It reports whether the
// pass was full and every transfer succeeded (more groups may be waiting).
func (r *replicated) balance(next map[replication.GroupID]time.Time) (more bool) {
	m := r.m
	nodes, _, _, _ := m.view.snapshot()
	now := time.Now()
	atOnce := balanceAtOnce
	if n := m.cfg.balanceAtOnce; n > 0 {
		atOnce = n
	}
	type move struct {
		g  replication.GroupID
		to replication.ReplicaID
	}
	var moves []move
	for _, g := range r.e.Groups() {
		if len(moves) == atOnce {
			break
		}
		if st, err := r.e.Status(g); err != nil || !st.IsLeader || r.epoch(uint32(g)) == 0 || now.Before(next[g]) {
			continue
		}
		reps := m.view.group(uint32(g)).Replicas
		if len(reps) == 0 || reps[0].Node == m.id {
			continue
		}
		first := reps[0]
		if n, live := nodes[first.Node]; !live || n.Leaving || n.Storage != first.Storage || n.Num != first.Num {
			continue
		}
		if !r.e.Responsive(g, replication.ReplicaID(first.ID), responsiveWithin(r.tick)) {
			continue // down (its registration may outlive it by a lease TTL), or behind
		}
		next[g] = now.Add(balanceBackoff)
		moves = append(moves, move{g, replication.ReplicaID(first.ID)})
	}
	if len(moves) == 0 {
		return false
	}
	ctx, cancel := context.WithTimeout(m.ctx, 3*r.tick*10)
	defer cancel()
	var wg sync.WaitGroup
	failed := make([]bool, len(moves))
	for i, mv := range moves {
		wg.Add(1)
		go func() { // owned here: balance waits for every transfer
			defer wg.Done()
			if err := r.e.TransferLeader(ctx, mv.g, mv.to); err != nil && m.ctx.Err() == nil {
				failed[i] = true
				m.log.Debug("leadership transfer for balance failed", "partition", uint32(mv.g), "to", uint64(mv.to), "err", err)
			}
		}()
	}
	wg.Wait()
	// Only a failed transfer waits out the backoff: a group handed over
	// may need balancing again soon (its first replica's node restarted:
	// with the backoff of its last success, it led nothing for 30 s after).
	more = len(moves) == atOnce
	for i, mv := range moves {
		if failed[i] {
			more = false
		} else {
			delete(next, mv.g)
		}
	}
	if h := m.cfg.balancePassed; h != nil {
		h(now, time.Now(), more)
	}
	return more
}
