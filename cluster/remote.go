package cluster

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	protocluster "github.com/asynkron/protoactor-go/cluster"
	etcdprovider "github.com/asynkron/protoactor-go/cluster/clusterproviders/etcd"
	"github.com/asynkron/protoactor-go/remote"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"

	"github.com/holdfast/holdfast/actors"
	"github.com/holdfast/holdfast/internal/owner"
	"github.com/holdfast/holdfast/internal/slogx"
)

// routerName is the name of every node's router actor: the one process a remote
// node sends requests for this node's objects to.
const routerName = "holdfast-router"

// maxWireMessage bounds one message between nodes (a handoff chunk, the largest
// write the API accepts and its reply).
const maxWireMessage = 80 << 20

// transport is a node's protoactor-go cluster member: remote messaging over gRPC,
// membership through protoactor-go's etcd provider, and our own identity lookup.
type transport struct {
	system   *actor.ActorSystem
	cluster  *protocluster.Cluster
	provider *etcdprovider.Provider
	conns    *grpcConns // the remote's outgoing connections (leaks.go)
	client   bool
	lookup   *ownerLookup
	log      *slog.Logger
	addr     string

	downMu sync.Mutex
	// down holds the addresses whose connection failed, and when it last
	// did; an entry goes when the address connects again or its node
	// registers again (clearDown).
	down map[string]time.Time

	// running holds the Calls of other nodes' requests this node runs whose
	// reply is not sent yet, for the pings of callers still waiting.
	running sync.Map
	// serving owns the goroutine of each request from another node; stop
	// cancels and waits for them before it leaves the protoactor cluster.
	serving *owner.Group
	// servers are serving's goroutines, reused (owner.Pool): the object's
	// turn runs on the goroutine that sends to it, tens of KiB deep, and a new
	// goroutine per request spent 9% of the forward's CPU growing its stack
	// (bench -case cluster-latency, other-64).
	servers *owner.Pool

	// dropReply, when set (tests), says whether to drop the reply of a request
	// of this op instead of sending it, as a connection lost on the way would.
	dropReply atomic.Pointer[func(op int) bool]
	// dropSend, when set (tests), says whether to drop a one-way message
	// instead of sending it.
	dropSend atomic.Pointer[func(*wireRequest) bool]
}

// maxIdleServers bounds the goroutines kept idle for requests from other
// nodes.
const maxIdleServers = 1024

// downFor is how long an address whose connection failed is taken for down:
// requests for it get 503 at once instead of waiting for a reply that cannot
// come. By then a crashed node's lease has expired and it shows as down anyway.
var downFor = 2 * time.Second

// isDown reports whether the connection to addr failed lately: routing then
// answers 503 "does not answer" at once. Past downFor it tries again, but the
// address stays unreachable (for cluster status) until it connects again.
func (t *transport) isDown(addr string) bool {
	t.downMu.Lock()
	defer t.downMu.Unlock()
	at, ok := t.down[addr]
	return ok && time.Since(at) <= downFor
}

// unreachable reports whether the last connection to addr failed and none
// succeeded since (nor did the node there register again).
func (t *transport) unreachable(addr string) bool {
	t.downMu.Lock()
	defer t.downMu.Unlock()
	_, ok := t.down[addr]
	return ok
}

// handler serves one request that arrived from another node.
type handler func(ctx context.Context, req *wireRequest) *wireReply

// startTransport starts the member listening on bind and known to the others
// as advertise (host:port each; an empty bind means advertise, and then port 0
// picks a free port). client members own nothing and activate nothing.
// feed, called on the router's goroutine in arrival order, takes one-way feed
// messages (they must not be reordered, and it must not block).
func startTransport(name, advertise, bind string, endpoints []string, lookup *ownerLookup, serve handler, feed func(*wireRequest), client bool, log *slog.Logger) (*transport, error) {
	listen, rename, err := bindAddr(advertise, bind)
	if err != nil {
		return nil, err
	}
	host, portStr, _ := net.SplitHostPort(listen)
	port, _ := strconv.Atoi(portStr)
	// protoactor logs routine events (and normal retries) at info and error: keep
	// its warnings and above, at debug level in our log, tagged.
	plog := slog.New(slogx.MinLevel(log.Handler(), slog.LevelWarn)).With("component", "protoactor")
	system := actor.NewActorSystem(actor.WithLoggerFactory(func(*actor.ActorSystem) *slog.Logger { return plog }))
	provider, err := etcdprovider.NewWithConfig(newKeys(name).members(), clientv3.Config{Endpoints: endpoints, DialTimeout: 5 * time.Second, Logger: zapNop()})
	if err != nil {
		return nil, fmt.Errorf("cluster: etcd provider: %w", err)
	}
	conns := newGRPCConns()
	rc := remote.Configure(host, port, append(rename,
		remote.WithServerOptions(grpc.MaxRecvMsgSize(maxWireMessage), grpc.MaxSendMsgSize(maxWireMessage)),
		remote.WithDialOptions(append(conns.dialOptions(), grpc.WithInsecure(), grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(maxWireMessage), grpc.MaxCallSendMsgSize(maxWireMessage)))...),
		remote.WithCallOptions(grpc.MaxCallRecvMsgSize(maxWireMessage), grpc.MaxCallSendMsgSize(maxWireMessage)))...)
	cc := protocluster.Configure(name, provider, lookup, rc)
	c := protocluster.New(system, cc)
	t := &transport{system: system, cluster: c, provider: provider, conns: conns, client: client, lookup: lookup, log: log, down: map[string]time.Time{}, serving: owner.New(nil)}
	t.servers = owner.NewPool(t.serving, maxIdleServers)
	// StartMember panics on errors (a port in use, etcd unreachable).
	if err := func() (err error) {
		defer func() {
			if r := recover(); r != nil {
				err = fmt.Errorf("cluster: start member: %v", r)
			}
		}()
		if client {
			c.StartClient()
		} else {
			c.StartMember()
		}
		return nil
	}(); err != nil {
		closeProviderClient(provider)
		conns.close()
		return nil, err
	}
	t.addr = system.Address()
	props := actor.PropsFromFunc(func(ctx actor.Context) {
		req, ok := ctx.Message().(*protocluster.GrainRequest)
		if !ok {
			return
		}
		var w wireRequest
		if err := decodeRequest(req.MessageData, &w); err != nil {
			t.log.Error("cannot decode a request from another node", "err", err)
			if s := ctx.Sender(); s != nil {
				ctx.Respond(encodeReply(t.log, &wireReply{Err: &wireError{Kind: actors.KindInternal, Msg: "cannot decode a request from another node"}}))
			}
			return
		}
		if w.Op == opFeed {
			feed(&w)
			return
		}
		sender := ctx.Sender()
		// Registered before anything later from the same node is read, so that
		// its pings see this request running.
		if w.Call != 0 {
			t.running.Store(w.Call, struct{}{})
		}
		if !t.servers.Go(func() {
			reply := t.serve(t.serving.Context(), &w, serve)
			if drop := t.dropReply.Load(); sender != nil && (drop == nil || !(*drop)(w.Op)) {
				system.Root.Send(sender, reply)
			}
			t.running.Delete(w.Call) // after the reply: replies to one node keep their order
		}) { // stopping
			if sender != nil {
				system.Root.Send(sender, encodeReply(t.log, &wireReply{Err: toWireError(&actors.Error{Kind: actors.KindUnavailable, Msg: "the node is shutting down", RetryAfter: time.Second})}))
			}
			t.running.Delete(w.Call)
		}
	})
	if _, err := system.Root.SpawnNamed(props, routerName); err != nil {
		c.Shutdown(false)
		closeProviderClient(provider)
		conns.close()
		return nil, fmt.Errorf("cluster: spawn the router: %w", err)
	}
	// Forget cached addresses on every membership change; note lost connections.
	system.EventStream.Subscribe(func(evt any) {
		switch e := evt.(type) {
		case *protocluster.ClusterTopology:
			lookup.forget()
		case *remote.EndpointTerminatedEvent:
			t.markDown(e.Address)
			lookup.forget()
		case *remote.EndpointConnectedEvent:
			t.downMu.Lock()
			delete(t.down, e.Address)
			t.downMu.Unlock()
		}
	})
	return t, nil
}

// bindAddr returns the address to listen on and the remote options that make
// the member known as advertise when it listens elsewhere (protoactor's
// advertised host: the address other members dial, and the one its PIDs and
// its etcd registration carry).
func bindAddr(advertise, bind string) (listen string, opts []remote.ConfigOption, err error) {
	if _, port, err := net.SplitHostPort(advertise); err != nil {
		return "", nil, fmt.Errorf("cluster advertise %q: %w", advertise, err)
	} else if _, err := strconv.Atoi(port); err != nil {
		return "", nil, fmt.Errorf("cluster advertise %q: bad port", advertise)
	}
	if bind == "" || bind == advertise {
		return advertise, nil, nil
	}
	_, port, err := net.SplitHostPort(bind)
	if err != nil {
		return "", nil, fmt.Errorf("cluster bind %q: %w", bind, err)
	}
	if n, err := strconv.Atoi(port); err != nil || n < 0 || n > 65535 {
		return "", nil, fmt.Errorf("cluster bind %q: bad port", bind)
	}
	if _, aport, _ := net.SplitHostPort(advertise); aport == "0" {
		return "", nil, fmt.Errorf("cluster advertise %q: port 0 only works when bind is empty or the same (the port is picked at listen)", advertise)
	}
	return bind, []remote.ConfigOption{remote.WithAdvertisedHost(advertise)}, nil
}

// serve runs one decoded request under ctx (t.serving's) and encodes its reply.
func (t *transport) serve(ctx context.Context, w *wireRequest, serve handler) *protocluster.GrainResponse {
	wait := w.Wait
	if wait <= 0 || wait > time.Minute {
		wait = time.Minute
	}
	ctx, cancel := context.WithTimeout(ctx, wait)
	reply := serve(ctx, w)
	cancel()
	if w.Op == opPing {
		_, busy := t.running.Load(w.Ask)
		reply.Tracks, reply.Busy = true, busy
	}
	return encodeReply(t.log, reply)
}

func encodeReply(log *slog.Logger, reply *wireReply) *protocluster.GrainResponse {
	data, err := encodeReplyData(reply)
	if err != nil {
		log.Error("cannot encode a reply for another node", "err", err)
		data, _ = encodeReplyData(&wireReply{Err: &wireError{Kind: actors.KindInternal, Msg: "internal error: the reply cannot cross between nodes"}})
	}
	return &protocluster.GrainResponse{MessageData: data}
}

// send sends req to the router at addr without waiting for a reply.
func (t *transport) send(addr string, req *wireRequest) {
	if drop := t.dropSend.Load(); drop != nil && (*drop)(req) {
		return
	}
	data, err := encodeRequest(req)
	if err != nil {
		t.log.Error("cannot encode a message for another node", "err", err)
		return
	}
	t.system.Root.Send(actor.NewPID(addr, routerName), &protocluster.GrainRequest{MessageData: data})
}

// errUnreachable is a request that got no reply from the other node.
var errUnreachable = errors.New("cluster: no reply from the node")

// call sends req to the router of node n and waits for its reply until ctx
// ends. A reply slower than probeAfter is fine (a long poll), but meanwhile the
// node is pinged every probeAfter: a node that does not answer is down or cut
// off, one that answers from another run (n.Boot, when set, differs)
// restarted and lost the request or ran it before, and one that is not running
// the request (any more) sent a reply that was lost, or never got the request
// (a connection that broke and came back drops messages). Either way the
// outcome is unknown and waiting longer only delays the 503.
func (t *transport) call(ctx context.Context, n NodeInfo, req *wireRequest) (*wireReply, error) {
	addr := n.Addr
	wait := time.Minute
	if dl, ok := ctx.Deadline(); ok {
		wait = time.Until(dl)
	}
	if wait <= 0 {
		return nil, ctx.Err()
	}
	req.Wait = wait
	req.Call = rand.Uint64() | 1 // never 0
	data, err := encodeRequest(req)
	if err != nil {
		return nil, err
	}
	f := t.system.Root.RequestFuture(actor.NewPID(addr, routerName), &protocluster.GrainRequest{MessageData: data}, wait)
	var res any
	done := make(chan struct{})
	go func() { res, err = f.Result(); close(done) }()
	// The waiter is call's own: on an early return the future is stopped, so
	// that the waiter ends now rather than at the future's timeout (up to a
	// minute), and call waits for it.
	defer func() {
		select {
		case <-done:
		default:
			t.system.Root.Stop(f.PID())
			<-done
		}
	}()
	probe := time.NewTicker(probeAfter)
	defer probe.Stop()
wait:
	for {
		select {
		case <-done:
			break wait
		case <-ctx.Done():
			return nil, fmt.Errorf("%w %s: %w", errUnreachable, addr, ctx.Err())
		case <-probe.C:
			pong, ok := t.ping(addr, req.Call)
			if !ok {
				t.markDown(addr)
				return nil, fmt.Errorf("%w %s: it does not answer a ping", errUnreachable, addr)
			}
			if n.Boot != "" && pong.Boot != n.Boot {
				return nil, fmt.Errorf("%w %s: the node restarted while the request was out", errUnreachable, addr)
			}
			if pong.Tracks && !pong.Busy {
				// The reply, if one was sent, left before the ping's: give
				// its delivery a moment before calling it lost.
				select {
				case <-done:
					break wait
				case <-time.After(lostReplyGrace):
					return nil, fmt.Errorf("%w %s: it is not running the request; the reply was lost or the request never arrived", errUnreachable, addr)
				}
			}
		}
	}
	if err != nil {
		return nil, fmt.Errorf("%w %s: %w", errUnreachable, addr, err)
	}
	resp, ok := res.(*protocluster.GrainResponse)
	if !ok {
		return nil, fmt.Errorf("%w %s: unexpected %T", errUnreachable, addr, res)
	}
	var reply wireReply
	if err := decodeReply(resp.MessageData, &reply); err != nil {
		return nil, err
	}
	return &reply, nil
}

// probeAfter is how long a call waits for its reply before it pings the node,
// and then between pings.
const probeAfter = 500 * time.Millisecond

// lostReplyGrace is how long a call still waits for its reply after a ping
// said the other node is not running it.
const lostReplyGrace = time.Second

// ping reports whether the router at addr answers within a second, with the
// boot (the run) of the node that answered and whether it is running the
// request call of this node (0: none asked).
func (t *transport) ping(addr string, call uint64) (pong *wireReply, ok bool) {
	data, err := encodeRequest(&wireRequest{Op: opPing, Ask: call})
	if err != nil {
		return nil, false
	}
	res, err := t.system.Root.RequestFuture(actor.NewPID(addr, routerName), &protocluster.GrainRequest{MessageData: data}, time.Second).Result()
	if err != nil {
		return nil, false
	}
	resp, ok := res.(*protocluster.GrainResponse)
	if !ok {
		return nil, false
	}
	var reply wireReply
	if decodeReply(resp.MessageData, &reply) != nil {
		return nil, false
	}
	return &reply, true
}

// clearDown forgets that addr's connection failed (the node there registered
// again: a new run).
func (t *transport) clearDown(addr string) {
	t.downMu.Lock()
	delete(t.down, addr)
	t.downMu.Unlock()
}

func (t *transport) markDown(addr string) {
	t.downMu.Lock()
	t.down[addr] = time.Now()
	t.downMu.Unlock()
}

// stop leaves the protoactor cluster. protoactor-go's etcd provider
// deregisters with no deadline: with etcd unreachable it would wait forever, so
// the wait is bounded (the registration then expires with its lease).
func (t *transport) stop(graceful bool) {
	// Requests from other nodes end first (their contexts end; their replies
	// still leave), and none starts any more.
	sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := t.serving.Close(sctx); err != nil {
		t.log.Warn("requests from other nodes did not end when told to; leaving them behind", "err", err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer t.conns.close()
		defer closeProviderClient(t.provider)
		if t.client {
			// Cluster.Shutdown assumes gossip, which a client does not start.
			_ = t.cluster.Config.ClusterProvider.Shutdown(false)
			t.system.Shutdown()
			t.cluster.Remote.Shutdown(false)
			t.stopEndpoints()
			return
		}
		if !graceful {
			// Cluster.Shutdown leaves the provider running when not graceful:
			// its keep-alive and watch loops would go on for ever (and spin
			// once its client is closed). It deregisters the member, which
			// routing does not depend on (ownerLookup). First, while the
			// remote still runs: the deregistration comes back to the
			// provider's watch as a topology change, which the remote's
			// endpoint manager handles; after the remote stopped, that
			// handling dereferenced a nil map and killed the process (seen
			// once in CI, in protoactor-go's removeEndpoint).
			_ = t.cluster.Config.ClusterProvider.Shutdown(false)
		}
		t.cluster.Shutdown(graceful)
		if !graceful {
			t.stopEndpoints()
		}
	}()
	select {
	case <-done:
		return
	case <-time.After(10 * time.Second):
	}
	// The provider's calls to etcd have no deadline: closing its client ends
	// them, and the shutdown goes on.
	t.log.Warn("the protoactor cluster did not stop within 10s (etcd unreachable?); closing its etcd client")
	closeProviderClient(t.provider)
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.log.Warn("the protoactor cluster did not stop; leaving it behind")
	}
}

// stopEndpoints stops the remote's connections to other nodes, which a
// Remote.Shutdown that is not graceful leaves redialing for ever (protoactor-go
// leaks them). Its server is stopped already, so a graceful Shutdown only
// stops the endpoints and returns at once.
//
// protoactor-go's endpointManager.stop then sends on the channel of every
// incoming stream in its map; a stream that failed (the server's Stop fails
// them all) closes its channel before its own goroutine deletes it from the
// map, so that send can hit a closed channel and panic (seen once in CI, in
// this goroutine). By then stop has stopped the endpoints' activator and
// supervisor, which is what this call is for; what the panic skips is the
// remaining sends to streams that are ending anyway, and a log line.
func (t *transport) stopEndpoints() {
	defer func() {
		if r := recover(); r != nil {
			t.log.Debug("protoactor-go's endpoint manager panicked while stopping (a stream closing at the same time); ignored", "panic", r)
		}
	}()
	t.cluster.Remote.Shutdown(true)
}

// ownerLookup is the identity lookup: an object identity resolves to the router
// of the node that owns the object's partition under the current table, never to
// a node that merely had it activated once (protoactor-go's disthash lookup
// routes by each member's own hash ring and can leave one identity active on two
// members). The owner itself refuses requests for partitions it does not serve,
// so a stale answer costs a retry, never a second activation. Cached router
// addresses are dropped on every membership or partition table change.
type ownerLookup struct {
	resolve func(identity string) (addr string, ok bool)
	mu      sync.Mutex
	cache   map[string]*actor.PID
}

func newOwnerLookup(resolve func(identity string) (string, bool)) *ownerLookup {
	return &ownerLookup{resolve: resolve, cache: map[string]*actor.PID{}}
}

// Get returns the PID of the router of the identity's owner, or nil when the
// partition has no live owner.
func (l *ownerLookup) Get(ci *protocluster.ClusterIdentity) *actor.PID {
	l.mu.Lock()
	defer l.mu.Unlock()
	if pid, ok := l.cache[ci.Identity]; ok {
		return pid
	}
	addr, ok := l.resolve(ci.Identity)
	if !ok {
		return nil
	}
	pid := actor.NewPID(addr, routerName)
	if len(l.cache) > 100_000 {
		clear(l.cache)
	}
	l.cache[ci.Identity] = pid
	return pid
}

// RemovePid forgets a cached PID that turned out dead.
func (l *ownerLookup) RemovePid(ci *protocluster.ClusterIdentity, _ *actor.PID) {
	l.mu.Lock()
	delete(l.cache, ci.Identity)
	l.mu.Unlock()
}

func (l *ownerLookup) Setup(*protocluster.Cluster, []string, bool) {}

func (l *ownerLookup) Shutdown() {}

// forget drops every cached PID.
func (l *ownerLookup) forget() {
	l.mu.Lock()
	clear(l.cache)
	l.mu.Unlock()
}
