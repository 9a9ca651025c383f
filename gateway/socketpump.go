package gateway

import (
	"context"
	"encoding/json"
	"errors"

	"github.com/coder/websocket"

	"github.com/holdfast/holdfast/actors"
)

// The pump: a durable channel's catch-up (see channel). It runs on its own
// goroutine, owned by the server's group, one per catching channel at most, and
// ends with the channel (ctx) or the socket.

// pageBytes is the size of one replay page the pump asks for: a quarter of the
// buffer, so that a page asked for once the queue is below half the buffer fits
// at once.
func (sk *socket) pageBytes() int { return max(sk.srv.cfg.SocketBuffer/4, 1) }

// startPump starts the channel's catch-up: the replay of (after, subAt] if the
// join had after_log_id (oldest is the oldest log_id the object held then),
// then a snapshot, then the stash.
func (ch *channel) startPump(subAt, oldest uint64) {
	ch.mu.Lock()
	defer ch.mu.Unlock()
	if !ch.gone {
		ch.startPumpLocked(subAt, oldest)
	}
}

// startPumpLocked is startPump with mu held.
func (ch *channel) startPumpLocked(subAt, oldest uint64) {
	if ch.pumping {
		return
	}
	ch.pumping = true
	after := ch.after
	if !ch.sk.srv.owned.Go(func(context.Context) { ch.pump(after, subAt, oldest) }) {
		ch.sk.shut(websocket.StatusGoingAway, "the server is shutting down")
	}
}

func (ch *channel) pump(after *uint64, subAt, oldest uint64) {
	// Nothing goes before the join reply.
	ch.mu.Lock()
	joined := ch.joined
	ch.mu.Unlock()
	if joined != nil {
		select {
		case <-joined:
		case <-ch.ctx.Done():
			return
		}
	}
	replaying := after != nil
	var from uint64
	if replaying {
		var err error
		if from, err = actors.ResumeAfter(*after, oldest, subAt); err != nil {
			if !ch.truncated(err) {
				return
			}
			replaying = false
		}
	}
	for to := subAt; ; {
		if replaying {
			var ok bool
			if from, replaying, ok = ch.replay(from, to); !ok {
				return
			}
		}
		// The snapshot: fetched once the queue is below half the buffer.
		if !ch.waitLow() {
			return
		}
		v, err := ch.request(actors.KVGet{})
		if err != nil {
			ch.fail(err)
			return
		}
		st := v.(*actors.KVState)
		if replaying && st.LogID > from {
			// Writes came since the replay's end: replay them too, so that the
			// replay ends at the snapshot, then fetch a new one (holding this
			// one meanwhile would keep up to a whole object per channel).
			to = st.LogID
			continue
		}
		body, err := json.Marshal(st)
		if err != nil {
			ch.fail(err)
			return
		}
		snap := frame{head: head(ch.joinRef, jsonNull, ch.topic, "snapshot"), body: body}
		ch.offerWait([]frame{snap}, func() { ch.settleStash(st.LogID) })
		return
	}
}

// replay queues the change log in (from, to] page by page, or log_truncated
// where it cannot go on. It returns where it ended, whether the replay goes
// on (false once log_truncated was sent), and false for ok if the channel
// ended.
func (ch *channel) replay(from, to uint64) (end uint64, replaying, ok bool) {
	for from < to {
		if !ch.waitLow() {
			return from, false, false
		}
		limit := min(uint64(actors.MaxLogLimit), to-from)
		ch.sk.srv.sockStats.replayPages.Add(1)
		v, err := ch.request(actors.KVReadLog{After: from, Limit: int(limit), MaxBytes: ch.sk.pageBytes()})
		if err != nil {
			// Compacted past the page (or the object failed): log_truncated,
			// then the snapshot.
			return from, false, ch.truncated(err)
		}
		page := v.(*actors.LogPage)
		frames := make([]frame, 0, len(page.Items))
		for _, it := range page.Items {
			if it.LogID > to {
				break // the stash has it
			}
			b, err := json.Marshal(it)
			if err != nil {
				ch.fail(err)
				return from, false, false
			}
			frames = append(frames, frame{head: head(ch.joinRef, jsonNull, ch.topic, "change"), body: b})
		}
		if !ch.offerWait(frames, nil) {
			return from, false, false
		}
		if page.Next <= from {
			break // nothing more to read
		}
		from = page.Next
	}
	return from, true, true
}

// truncated queues log_truncated if err is a *LogTruncatedError (its After is
// the last log_id the client has), and fails the channel otherwise. It reports
// false if the channel ended.
func (ch *channel) truncated(err error) bool {
	var lt *actors.LogTruncatedError
	if !errors.As(err, &lt) {
		ch.fail(err)
		return false
	}
	ev := actors.TruncatedEvent(lt)
	return ch.offerWait([]frame{{head: head(ch.joinRef, jsonNull, ch.topic, ev.Name), body: ev.Payload}}, nil)
}

// waitLow waits until the socket owes less than half its buffer behind the
// frame being written.
func (ch *channel) waitLow() bool {
	sk := ch.sk
	return sk.waitUntil(ch.ctx, func() bool { return sk.queued-sk.head <= sk.srv.cfg.SocketBuffer/2 })
}

// offerWait queues frames once they fit, then runs then (if not nil), both
// with the channel's mu held so that no live event of the channel goes between.
// It reports false if the channel or the socket ended first.
func (ch *channel) offerWait(frames []frame, then func()) bool {
	sk := ch.sk
	for {
		ch.mu.Lock()
		if ch.gone {
			ch.mu.Unlock()
			return false
		}
		ok, closed := sk.offer(frames)
		if ok && then != nil {
			then()
		}
		ch.mu.Unlock()
		if ok || closed {
			return ok
		}
		n := 0
		for i := range frames {
			n += frames[i].size()
		}
		if !sk.waitUntil(ch.ctx, func() bool { return sk.fits(n) }) {
			return false
		}
	}
}

func (ch *channel) request(msg any) (any, error) {
	ctx, cancel := context.WithTimeout(ch.ctx, ch.sk.srv.cfg.RequestTimeout)
	defer cancel()
	return ch.sk.srv.cfg.Node.Request(ctx, ch.id, msg)
}

// fail ends a channel whose catch-up failed as if the object had dropped it:
// phx_error, and the client joins again. The object is told to forget it.
func (ch *channel) fail(err error) {
	if ch.ctx.Err() != nil {
		return // left, or the socket closed
	}
	ch.sk.srv.log.Warn("a websocket channel could not catch up", "socket_id", ch.sk.id, "topic", ch.topic, "err", err)
	ch.Lost(err)
	ch.sk.leave(ch)
}

var _ actors.Subscriber = (*channel)(nil)
