package actors

import (
	"context"
	"fmt"
	"time"
)

// Every goroutine a Host starts has an owner that Host.Close stops and waits
// for, before the caller closes the pipeline and the database:
//
//   - sweepLoop and replayQueues: h.swept; Close closes h.stop and waits.
//   - the alarm scheduler's loop and workers: h.sched; Close closes it.
//   - user push handlers (queuepush.go): h.push. Their context ends as Close
//     begins (their results are refused from then on: the deliveries expire
//     and replay), at their visibility deadline, and when their activation's
//     partition moves away (object.moved).
//   - cold I/O (reads, flushes, lease reads of cold records), the queue replay
//     of a partition taken up, and the retries of dropPartition: h.bg. Its
//     context ends once the requests in flight were answered (a cold read in
//     flight is one of them), or when Close's ctx ends.
//
// After Stop, a group starts nothing: a caller whose goroutine is refused does
// at once what it would have done on a cancelled context.

// closeGrace is how long Close still waits for its cancelled goroutines when
// its ctx ended already (it gave up on the requests in flight): they were only
// just told to stop, and the caller closes the pipeline and the database next.
const closeGrace = 2 * time.Second

// closeOwned cancels the push handlers and the background goroutines and waits
// for them, until ctx ends and then at most closeGrace more.
func (h *Host) closeOwned(ctx context.Context) error {
	h.push.Stop()
	h.bg.Stop()
	err := h.waitOwned(ctx)
	if err != nil && ctx.Err() != nil {
		gctx, cancel := context.WithTimeout(context.Background(), closeGrace)
		defer cancel()
		err = h.waitOwned(gctx)
	}
	return err
}

func (h *Host) waitOwned(ctx context.Context) error {
	if err := h.push.Wait(ctx); err != nil {
		return fmt.Errorf("actors: close: push handlers: %w", err)
	}
	if err := h.bg.Wait(ctx); err != nil {
		return fmt.Errorf("actors: close: cold I/O and retries: %w", err)
	}
	return nil
}

// errClosing answers work refused because the host is closing.
func errClosing() error {
	return &Error{Kind: KindUnavailable, Msg: "the node is shutting down", RetryAfter: time.Second}
}

// dropRetry is how long a dropped activation waits before it looks again at
// whether the requests that reached it were answered.
const dropRetry = 10 * time.Millisecond

// retryDrop sends dropPartition to act again after dropRetry, from a goroutine
// of h.bg; once the host closes, Close stops the actor instead.
func (h *Host) retryDrop(act *activation) {
	h.bg.Go(func(ctx context.Context) {
		t := time.NewTimer(dropRetry)
		defer t.Stop()
		select {
		case <-t.C:
			h.send(act, dropPartition{}, false)
		case <-ctx.Done():
		}
	})
}

// pushGone returns the context that ends when this activation moves away
// (cancelPush): the push handlers it started are told to stop. It is not a
// child of the host's context, because an activation that passivates never
// cancels it, and a child would stay registered with its parent.
func (o *object) pushGone() context.Context {
	if o.push.gone == nil {
		o.push.gone, o.push.leave = context.WithCancel(context.Background())
	}
	return o.push.gone
}

// cancelPush ends the context of the push handlers this activation started.
func (o *object) cancelPush() {
	if o.push.leave != nil {
		o.push.leave()
	}
}
