// Package actors runs Holdfast's durable objects: every object (app, type,
// key) is one single-threaded protoactor-go actor that owns its keyspace in
// Badger, and every behaviour (KV slots, the retained log, the write-ahead
// queue, alarms, the live feed, user-defined types) is messages that actor
// handles one at a time. A map of the package, by concern:
//
// # An object's life (host.go, object.go)
//
//   - Host (host.go) routes every message to the object's one activation,
//     activating it on its first message and passivating it when idle (one
//     sweep goroutine for the node, sweepLoop). Activations live in shards of
//     a map; an activation counts its requests in flight and passivates only
//     at zero, under its shard's lock, so no request reaches a stopped actor.
//   - The mailbox runs on the sender's goroutine (protoactor's synchronized
//     dispatcher, Host.send): a request's caller runs the object's turn, then
//     waits for the reply. A turn queues its write on the pipeline without
//     waking the committer; send commits what the turns queued, or lets the
//     caller commit it when the committer is idle (Pipeline.Help).
//   - object (object.go) is one activation: Receive dispatches the host's own
//     messages (activation, passivate, flush and alarm wake-ups) and the
//     requests (handle, dispatch). A behaviour's state loads on its first
//     message (kv, log, alarms, queue fields).
//   - Names are checked where every caller's are, just before activation
//     (names.go); errors carry a Kind the gateway maps to a status
//     (errors.go).
//
// # Durability: the output gate and the overlay (object.go, overlay.go, pipeline.go)
//
//   - Every write goes through Pipeline (pipeline.go): a single node's commit
//     pipeline (persistence, group commit) or a replicated node's raft
//     proposer. A write's Ticket completes once it is durable (replicated: on
//     a majority) and is marked applied once Badger shows it.
//   - The output gate: a reply is held (envelope, object.last) until the
//     latest write of its activation is durable, so nothing is acknowledged
//     that a crash could lose. A write that fails marks the activation broken:
//     its memory may be ahead of disk, so it answers 503 and goes away.
//   - The overlay (overlay.go) holds what the actor wrote and reads back before
//     Badger shows it: the actor moves on as soon as it submitted a write.
//   - Every write carries the partition's epoch the activation was admitted
//     under (a handoff or a lost lease moves it on, and the write is refused:
//     a fence). logfloor.go keeps log_ids above what an object issued before
//     its partition lost data.
//   - One activation per object per node serves: the one in the routing
//     table. One that leaves it (dropped with its partition, broken,
//     passivated) runs none of the requests left in its mailbox: it hands
//     them, unrun and in order, to the object's activation now (Host.resend),
//     or, when this node does not serve the partition now, refuses them (not
//     served: a cluster's router asks the node that does). Its chain is
//     retired, so none of its writes the pipeline has not taken yet lands
//     (persistence.Chain.Retire), and the next activation's first read
//     waits for those the pipeline took before the retirement (the shard's
//     landing map, persistence.Chain.WaitLanded). The epoch alone did not say it: a
//     replicated node's lease can lapse and come back within one raft term,
//     and the dropped activation then went on beside a fresh one, both
//     writing from their own state (two increments answered n = 298, one
//     lost, in a CI run). The handed-over requests run on the next
//     activation before the ones posted to it directly (gate.go), so one
//     sender's requests to one object keep their order across the change.
//
// # The behaviours
//
//   - KV (kv.go, kvapi.go, kvplan.go, slots.go): slots, the change log and
//     log_id, idempotency records; kvplan.go plans a write's ops against the
//     limits of spec/objects.md; slots.go keeps small objects' slots in a
//     slice.
//   - The retained log (log.go, logapi.go): its state, appends, reads and
//     cursors; blocks, the records of one append (logblock.go); retention
//     and trimming (logtrim.go); cold segments (logcold.go, through
//     cold.Store); leases for parallel consumers (loglease.go).
//   - The write-ahead queue (queue.go, queueapi.go): its state and
//     transactions, enqueues, messages and their (message, target) pairs;
//     keys and receipts (queuekeys.go); deliveries: receive, expiry, retries,
//     ack, nack (queuedeliver.go); push handlers (queuepush.go), dead letters
//     (queuedead.go), compaction (queuecompact.go), replay of deliveries in
//     flight at start (queuereplay.go), the node-wide depth (queuedepth.go),
//     the alarm action that enqueues (queuealarm.go).
//   - Alarms (alarm.go, alarmapi.go, alarmpage.go): durable per-object
//     alarms; the node's one scheduler is package alarms.
//   - The live feed (subscribe.go): an object's subscribers get every change
//     once, in log_id order, after it is durable.
//   - User-defined types (usertypes.go): Go handlers that run in the object's
//     turn with their own transactional storage.
//
// # The node around the objects
//
//   - keys.go divides an object's keyspace among the behaviours; the
//     partition indexes (queues with deliveries in flight, queue objects)
//     live beside them.
//   - memory.go and memory_budget.go: the node's memory budget; one governor
//     per Host samples the heap and sheds idle objects, or has writes
//     refused, when the node is over it.
//   - owners.go: every goroutine the Host starts (cold I/O, retries, the
//     scheduler, push handlers) has an owner that Close stops and waits for.
//   - served.go notes which node, partition and epoch answered a request (the
//     cluster's ownership tests).
//   - list.go: listing a type's keys (Host.ListKeys) from storage, without
//     activating objects: what counts as state per listing.
//   - plantedbug_on.go / plantedbug_off.go: the torture tool's planted bug
//     (build tag plantedbug: replies leave before their writes are durable),
//     which its check must catch; off in every normal build.
package actors
