package cluster

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/holdfast/holdfast/actors"
)

// Listing a type's keys across the cluster (spec/batch.md): the node asked
// sends each node the partitions it serves (it lists its own), each answers
// with its first Limit+1 keys of those partitions and the partitions it no
// longer serves, and the asking node merges the answers and asks again,
// elsewhere, for the partitions not answered (a move, an election), until
// RequestWait. Every partition is listed by the node that serves it, after
// it applied every write acknowledged before the listing (Host.ListKeys): a
// listing misses no object acknowledged before it began. A partition with no
// server after RequestWait fails the listing (503, naming it): a page
// silently short of a partition's objects would look complete.

// listRequest asks a node for the keys of q in partitions Parts (opList).
type listRequest struct {
	Query actors.ListQuery
	Parts []uint32
}

// listReply is a node's answer: its keys in byte order, and the partitions
// of the request it does not serve.
type listReply struct {
	Keys      []string
	NotServed []uint32
}

func init() {
	RegisterWireType(listRequest{})
	RegisterWireType(listReply{})
}

// List returns a page of the keys of q's objects, from every partition of
// the cluster (or of this node, on its own).
func (n *Node) List(ctx context.Context, q actors.ListQuery) (actors.ListPage, error) {
	if err := q.Check(); err != nil {
		return actors.ListPage{}, err
	}
	more := q
	more.Limit++ // one more key says whether a next page follows
	var keys []string
	var err error
	if n.member != nil {
		keys, err = n.member.list(ctx, more)
	} else {
		var notServed []uint32
		keys, notServed, err = n.host.ListKeys(ctx, more, allPartitions(n.db.Partitions()))
		if err == nil && len(notServed) > 0 {
			err = &actors.Error{Kind: actors.KindUnavailable, Msg: fmt.Sprintf("partitions %v are not served now", notServed), RetryAfter: time.Second}
		}
	}
	if err != nil {
		return actors.ListPage{}, err
	}
	return actors.PageOf(keys, q.Limit), nil
}

func allPartitions(n int) []uint32 {
	out := make([]uint32, n)
	for i := range out {
		out[i] = uint32(i)
	}
	return out
}

// list is Node.List in a cluster: the first q.Limit keys, merged from the
// nodes that serve the partitions.
func (m *member) list(ctx context.Context, q actors.ListQuery) ([]string, error) {
	remaining := allPartitions(len(m.state))
	deadline := time.Now().Add(m.cfg.RequestWait)
	var keys []string
	for attempt := 0; ; attempt++ {
		byNode := map[string][]uint32{}
		var left []uint32
		var why error
		for _, p := range remaining {
			to, err := m.listTarget(p, attempt)
			if to == "" {
				left, why = append(left, p), err
				continue
			}
			byNode[to] = append(byNode[to], p)
		}
		var mu sync.Mutex
		var fatal error
		var wg sync.WaitGroup
		for to, parts := range byNode {
			wg.Go(func() {
				got, notServed, err := m.listOn(ctx, to, q, parts)
				mu.Lock()
				defer mu.Unlock()
				var ae *actors.Error
				switch {
				case err == nil:
					keys = append(keys, got...)
					left = append(left, notServed...)
				case errors.As(err, &ae) && ae.Kind != actors.KindUnavailable && ae.Kind != actors.KindInternal:
					fatal = err // the query itself is refused: no node takes it
				default:
					left, why = append(left, parts...), err
				}
			})
		}
		wg.Wait()
		if fatal != nil {
			return nil, fatal
		}
		if len(left) == 0 {
			break
		}
		if ctx.Err() != nil || time.Now().After(deadline) {
			slices.Sort(left)
			msg := fmt.Sprintf("the listing could not reach the nodes of partitions %v", left)
			if why != nil {
				msg += ": " + why.Error()
			}
			return nil, &actors.Error{Kind: actors.KindUnavailable, Msg: msg, RetryAfter: time.Second}
		}
		remaining = left
		sleep(ctx, 50*time.Millisecond)
	}
	slices.Sort(keys)
	keys = slices.Compact(keys) // a partition answered twice (it moved between two asks)
	return keys[:min(len(keys), q.Limit)], nil
}

// listTarget is the node to ask for partition p's keys, or "" and why none
// is known now.
func (m *member) listTarget(p uint32, attempt int) (string, error) {
	if m.servingEpoch(p) != 0 {
		return m.id, nil
	}
	if m.r != nil {
		g := m.view.group(p)
		if len(g.Replicas) == 0 {
			return "", fmt.Errorf("partition %d is not formed yet", p)
		}
		to := m.r.route(p, g, map[string]bool{m.id: true}, attempt)
		if info, live := m.view.node(to); to == "" || !live || m.tr.isDown(info.Addr) {
			return "", fmt.Errorf("partition %d has no reachable leader now", p)
		}
		return to, nil
	}
	owner := m.view.part(p).Owner
	if info, live := m.view.node(owner); owner == "" || owner == m.id || !live || m.tr.isDown(info.Addr) {
		return "", fmt.Errorf("partition %d has no reachable owner now", p)
	}
	return owner, nil
}

// listOn lists q in parts on node to (this node: its host).
func (m *member) listOn(ctx context.Context, to string, q actors.ListQuery, parts []uint32) ([]string, []uint32, error) {
	if to == m.id {
		return m.n.host.ListKeys(ctx, q, parts)
	}
	info, live := m.view.node(to)
	if !live {
		return nil, nil, fmt.Errorf("node %s is down", to)
	}
	reply, err := m.tr.call(ctx, info, &wireRequest{Op: opList, Msg: &listRequest{Query: q, Parts: parts}, From: m.id})
	if err != nil {
		return nil, nil, err
	}
	if err := reply.Err.err(); err != nil {
		return nil, nil, err
	}
	lr, ok := reply.Val.(*listReply)
	if !ok {
		return nil, nil, fmt.Errorf("node %s answered a listing with %T", to, reply.Val)
	}
	return lr.Keys, lr.NotServed, nil
}

// serveList answers another node's opList.
func (m *member) serveList(ctx context.Context, req *wireRequest) *wireReply {
	lr, ok := req.Msg.(*listRequest)
	if !ok {
		return &wireReply{Err: toWireError(&actors.Error{Kind: actors.KindInternal, Msg: fmt.Sprintf("a listing request carried %T", req.Msg)})}
	}
	if m.n == nil {
		return &wireReply{Val: &listReply{NotServed: lr.Parts}}
	}
	keys, notServed, err := m.n.host.ListKeys(ctx, lr.Query, lr.Parts)
	if err != nil {
		return &wireReply{Err: toWireError(err)}
	}
	return &wireReply{Val: &listReply{Keys: keys, NotServed: notServed}}
}
