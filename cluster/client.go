package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/holdfast/holdfast/actors"
	"github.com/holdfast/holdfast/internal/owner"
)

// ClientConfig configures a client member: an in-cluster Go service that
// messages objects directly, without HTTP, and owns no partitions.
type ClientConfig struct {
	// Name is the cluster's name.
	Name string
	// ID names this client in logs and in the nodes' view of who sent what.
	ID string
	// Advertise is the host:port nodes reach this client at (live feeds); port 0
	// picks a free one.
	Advertise string
	// Endpoints are etcd's client endpoints.
	Endpoints []string
	// RequestWait bounds how long a request waits for a moving partition; zero
	// means 5s.
	RequestWait time.Duration
	// Logger is the client's logger; nil means slog.Default().
	Logger *slog.Logger
}

// Client is a client member. It implements actors.Requester, so the typed Go
// APIs work over it as they do over an embedded runtime:
//
//	kv := actors.NewKV(client, id) // also NewLog, NewQueue, NewAlarms
//
// and return the same typed errors.
type Client struct {
	m *member
}

// StartClient joins cluster cfg.Name as a client member.
func StartClient(cfg ClientConfig) (*Client, error) {
	if cfg.Name == "" || cfg.ID == "" || len(cfg.Endpoints) == 0 {
		return nil, errors.New("cluster client: name, id and etcd endpoints are required")
	}
	if cfg.Advertise == "" {
		cfg.Advertise = "127.0.0.1:0"
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.RequestWait <= 0 {
		cfg.RequestWait = 5 * time.Second
	}
	cli, err := dial(cfg.Endpoints)
	if err != nil {
		return nil, err
	}
	k := newKeys(cfg.Name)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	resp, err := cli.Get(ctx, k.meta())
	cancel()
	if err != nil || len(resp.Kvs) == 0 {
		_ = cli.Close()
		if err == nil {
			err = fmt.Errorf("no cluster %q in etcd %v", cfg.Name, cfg.Endpoints)
		}
		return nil, fmt.Errorf("cluster client: %w", err)
	}
	var meta clusterMeta
	if err := json.Unmarshal(resp.Kvs[0].Value, &meta); err != nil {
		_ = cli.Close()
		return nil, fmt.Errorf("cluster meta: %w", err)
	}
	m := &member{
		cfg: ClusterConfig{Name: cfg.Name, NodeID: cfg.ID, Advertise: cfg.Advertise, Endpoints: cfg.Endpoints, RequestWait: cfg.RequestWait},
		id:  cfg.ID, log: cfg.Logger.With("client", cfg.ID), cli: cli, k: k, view: newView(meta.Partitions), boot: newBoot(),
		state: make([]uint8, meta.Partitions), subs: newRemoteSubs(), kick: make(chan struct{}, 1), leaveAsked: make(chan struct{}),
	}
	if rf := meta.rf(); rf > 1 {
		// Requests go to each partition's leader as a node without a replica
		// of it sends them (replicated.request): to the leader the last
		// refusal named, else to the group's replicas in turn. No engine:
		// the client runs no replica.
		m.r = &replicated{m: m, rf: rf, hints: make([]atomic.Pointer[string], meta.Partitions)}
	}
	m.owned = owner.New(nil)
	m.ctx, m.cancel = m.owned.Context(), m.owned.Stop
	tr, err := startTransport(cfg.Advertise, "", m.serveRemote, nil, m.serveFeed, m.log)
	if err != nil {
		m.cancel()
		_ = cli.Close()
		return nil, err
	}
	m.tr = tr
	m.goOwned(func() { m.view.follow(m.ctx, cli, k, m.log) })
	m.goOwned(func() {
		for {
			select {
			case <-m.ctx.Done():
				return
			case <-time.After(time.Second):
				m.sweepSubs()
			}
		}
	})
	deadline := time.Now().Add(10 * time.Second)
	for {
		m.view.mu.RLock()
		synced := m.view.synced
		m.view.mu.RUnlock()
		if synced {
			return &Client{m: m}, nil
		}
		if time.Now().After(deadline) {
			m.stop(false)
			return nil, errors.New("cluster client: cannot read the cluster's state from etcd")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Request sends msg to object id on the node that owns it and returns the reply.
func (c *Client) Request(ctx context.Context, id actors.ObjectID, msg any) (any, error) {
	v, s, err := c.m.request(ctx, id, msg)
	if s.Epoch != 0 {
		actors.RecordServed(ctx, s)
	}
	return v, err
}

// Close leaves the cluster.
func (c *Client) Close() { c.m.stop(false) }
