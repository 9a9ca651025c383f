package actors

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"slices"
	"time"

	"github.com/holdfast/holdfast/persistence"
)

// Sub-keys of the KV keyspace. An object's log_id is its newest change-log entry
// and the oldest log_id it holds is its oldest entry: the log always keeps at least
// its newest entry, so no separate record is needed.
const (
	kvSlot    byte = 's' // slot name -> JSON value
	kvLog     byte = 'l' // log_id (uint64 BE) -> JSON [{"key","value"}...]
	kvIdem    byte = 'i' // idempotency key -> JSON idemRecord
	kvIdemExp byte = 'x' // expiry (uint64 BE ms) | idempotency key -> empty
)

// kvState is the KV behaviour's state, fully resident while the object is active.
type kvState struct {
	ks    persistence.Keyspace
	slots slotTable
	size  int    // sum of slotBytes
	logID uint64 // last assigned log_id; 0 for a new object
	// oldest is the lowest log_id still held in the change log; logID+1 when the
	// log holds nothing.
	oldest uint64
}

func (k *kvState) slot(name string) (json.RawMessage, bool) {
	return k.slots.get(name)
}

func (k *kvState) stateBytes() int { return k.size }

// readBack reports whether a key of this keyspace is read from storage after it
// was written: change-log entries and idempotency records are; slots live in memory.
func (k *kvState) readBack(key []byte) bool {
	n := len(k.ks.Prefix())
	return len(key) > n && key[n] != kvSlot
}

func (o *object) kvLoad() (*kvState, error) {
	if o.kv != nil {
		return o.kv, nil
	}
	k := &kvState{ks: persistence.NewKeyspace(o.part, o.act.id, behaviourKV), oldest: 1}
	// Activation happens only when no earlier activation has writes in flight, so
	// Badger holds the whole log.
	logPrefix := k.ks.Key(kvLog, nil)
	first, last, found, err := o.h.db.Ends(o.bg(), logPrefix)
	if err != nil {
		return nil, unavailable("cannot load the object", err)
	}
	if found {
		k.oldest = binary.BigEndian.Uint64(first[len(logPrefix):])
		k.logID = binary.BigEndian.Uint64(last[len(logPrefix):])
	}
	prefix := k.ks.Key(kvSlot, nil)
	err = o.st.scan(o.bg(), prefix, nil, nil, func(key, value []byte) (bool, error) {
		name := string(key[len(prefix):])
		k.slots.set(name, append(json.RawMessage(nil), value...))
		k.size += slotBytes(name, value)
		return true, nil
	})
	if err != nil {
		return nil, unavailable("cannot load the object", err)
	}
	o.kv = k
	return k, nil
}

func (o *object) kvGet() (any, error) {
	k, err := o.kvLoad()
	if err != nil {
		return nil, err
	}
	// Values are never changed in place, so a shallow copy is a consistent snapshot.
	state := make(map[string]json.RawMessage, k.slots.len())
	k.slots.each(func(n string, v json.RawMessage) { state[n] = v })
	return &KVState{State: state, LogID: k.logID}, nil
}

func (o *object) kvGetSlot(slot string) (any, error) {
	// A name no write takes is refused as the writes refuse it, not "not found".
	if err := validateSlot(slot); err != nil {
		return nil, err
	}
	k, err := o.kvLoad()
	if err != nil {
		return nil, err
	}
	v, ok := k.slots.get(slot)
	if !ok {
		return nil, notFoundf("slot %q not found", slot)
	}
	return v, nil
}

// idemRecord is the stored first reply of an idempotent write.
type idemRecord struct {
	Fingerprint string          `json:"fp"`
	ExpiresAt   int64           `json:"exp"`
	LogID       uint64          `json:"log_id"`
	Value       json.RawMessage `json:"value,omitempty"`
}

func fingerprint(m *KVWrite) (string, error) {
	b, err := json.Marshal(struct {
		Route       string `json:"route"`
		Ops         []Op   `json:"ops"`
		Transaction bool   `json:"tx"`
		Purge       bool   `json:"purge"`
	}{m.Route, m.Ops, m.Transaction, m.Purge})
	if err != nil {
		return "", badRequestf("value is not valid JSON")
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:]), nil
}

func (o *object) kvWrite(m *KVWrite) (any, error) {
	k, err := o.kvLoad()
	if err != nil {
		return nil, err
	}
	now := o.h.now()
	var fp string
	if m.IdempotencyKey != "" {
		if len(m.IdempotencyKey) > MaxIdempotencyKey {
			return nil, badRequestf("Idempotency-Key is %d bytes, at most %d", len(m.IdempotencyKey), MaxIdempotencyKey)
		}
		if fp, err = fingerprint(m); err != nil {
			return nil, err
		}
		rec, found, err := o.idemLookup(k, m.IdempotencyKey, now)
		if err != nil {
			return nil, err
		}
		if found {
			if rec.Fingerprint != fp {
				return nil, invalidf("Idempotency-Key %q was already used for a different request", m.IdempotencyKey)
			}
			return &WriteResult{LogID: rec.LogID, Value: rec.Value}, nil
		}
	}
	var changes []Change
	var incremented json.RawMessage
	switch {
	case m.Purge:
		if len(m.Ops) > 0 {
			return nil, badRequestf("a purge takes no ops")
		}
		changes = purgeChanges(k)
	case m.Transaction && len(m.Ops) == 0:
		return nil, invalidf("transaction is empty")
	case m.Transaction && len(m.Ops) > MaxTransactionOps:
		return nil, invalidf("transaction has %d ops, at most %d", len(m.Ops), MaxTransactionOps)
	default:
		changes, incremented, err = plan(k, m.Ops)
		if err != nil {
			return nil, err
		}
	}

	res := &WriteResult{LogID: k.logID}
	w := &persistence.Write{}
	if len(changes) > 0 || m.Purge {
		res.LogID = o.nextLogID(k)
		res.Changes = changes
		if !m.Transaction && len(m.Ops) == 1 && m.Ops[0].Op == "increment" {
			res.Value = incremented
		}
		o.kvStage(k, w, changes, m.Purge)
	}
	if m.IdempotencyKey != "" {
		if err := o.idemStage(k, w, m.IdempotencyKey, idemRecord{
			Fingerprint: fp, ExpiresAt: now.Add(IdempotencyWindowH * time.Hour).UnixMilli(),
			LogID: res.LogID, Value: res.Value,
		}, now); err != nil {
			return nil, err
		}
	}
	if len(w.Sets) == 0 && len(w.Deletes) == 0 {
		return res, nil
	}
	if len(changes) > 0 || m.Purge {
		o.kvApply(k, changes, m.Purge)
	}
	o.submit(w, k.readBack)
	if len(changes) > 0 || m.Purge {
		batch := m.Purge || m.Transaction || m.Route == RoutePatch || len(changes) > 1
		o.kvBroadcast(res.LogID, changes, batch)
	}
	return res, nil
}

func purgeChanges(k *kvState) []Change {
	names := k.slots.names()
	changes := make([]Change, 0, len(names))
	for _, n := range names {
		prev, _ := k.slots.get(n)
		changes = append(changes, Change{Slot: n, Previous: prev})
	}
	return changes
}

// kvStage adds to w the keys of one log entry made of changes: the slots, the entry,
// and the change-log entries that fall out of retention (all of them on a purge).
// It does not change k.
func (o *object) kvStage(k *kvState, w *persistence.Write, changes []Change, purge bool) {
	id := o.nextLogID(k)
	// The entry first: each slot's value is a part of it, which the
	// write-ahead log then stores once (persistence.KV.Of).
	entry, at := encodeLogEntry(changes)
	w.Sets = slices.Grow(w.Sets, 1+len(changes))
	of := len(w.Sets) + 1
	w.Sets = append(w.Sets, persistence.KV{Key: k.ks.KeyUint64(kvLog, id), Value: entry})
	for i, c := range changes {
		key := k.ks.KeyString(kvSlot, c.Slot)
		if c.Value == nil {
			w.Deletes = append(w.Deletes, key)
		} else {
			w.Sets = append(w.Sets, persistence.KV{Key: key, Value: c.Value, Of: of, At: at[i]})
		}
	}
	oldest := o.newOldest(k, purge)
	for i := k.oldest; i < oldest && i <= k.logID; i++ {
		w.Deletes = append(w.Deletes, k.ks.KeyUint64(kvLog, i))
	}
}

// nextLogID is the log_id of the object's next change-log entry: the one after
// its newest, or, when its partition's data losses raised the floor above it
// (an object with no stored entry, or one whose partition was recovered from
// a replica that may lack its newest entries), the one after the floor
// (logfloor.go).
func (o *object) nextLogID(k *kvState) uint64 {
	return max(k.logID, logFloor(o.h.dataLosses(o.part))) + 1
}

// newOldest is the oldest log_id held after the next entry is recorded. An
// entry that jumps over the floor starts the log again: the entries before
// the jump go, so that a reader resuming from any log_id below the floor
// (one this object may have issued before the loss, on a lost replica) gets
// log_truncated instead of a history with a hole in it.
func (o *object) newOldest(k *kvState, purge bool) uint64 {
	id := o.nextLogID(k)
	if purge || k.logID == 0 || id != k.logID+1 {
		return id
	}
	keep := uint64(o.opts.ChangeLogEntries)
	oldest := k.oldest
	if id >= keep && id-keep+1 > oldest {
		oldest = id - keep + 1
	}
	return oldest
}

// kvApply makes the staged entry the in-memory state.
func (o *object) kvApply(k *kvState, changes []Change, purge bool) {
	k.oldest = o.newOldest(k, purge)
	k.logID = o.nextLogID(k)
	for _, c := range changes {
		k.size -= slotBytes(c.Slot, c.Previous)
		if c.Value == nil {
			k.slots.delete(c.Slot)
			continue
		}
		k.slots.set(c.Slot, c.Value)
		k.size += slotBytes(c.Slot, c.Value)
	}
}

type logItemJSON struct {
	Key   string          `json:"key"`
	Value json.RawMessage `json:"value"`
}

// encodeLogEntry writes changes as [{"key":...,"value":...},...], and where
// each change's value starts in it. Values are compact JSON already (plan made
// them so); a deleted slot is null.
func encodeLogEntry(changes []Change) ([]byte, []int) {
	at := make([]int, len(changes))
	n := 2
	for _, c := range changes {
		n += len(c.Slot) + len(c.Value) + 24
	}
	b := make([]byte, 0, n)
	b = append(b, '[')
	for i, c := range changes {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, `{"key":`...)
		b = appendJSONString(b, c.Slot)
		b = append(b, `,"value":`...)
		at[i] = len(b)
		if c.Value == nil {
			b = append(b, "null"...)
		} else {
			b = append(b, c.Value...)
		}
		b = append(b, '}')
	}
	return append(b, ']'), at
}

// appendJSONString appends s as a JSON string: json.Marshal's bytes, except that
// '<', '>' and '&' stay as they are (json.Marshal escapes them for HTML).
func appendJSONString(b []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c == '"' || c == '\\' || c >= 0x7F {
			q, _ := json.Marshal(s) // rare: escapes and non-ASCII
			return append(b, q...)
		}
	}
	b = append(b, '"')
	b = append(b, s...)
	return append(b, '"')
}

func (o *object) kvReadLog(m KVReadLog) (any, error) {
	k, err := o.kvLoad()
	if err != nil {
		return nil, err
	}
	if m.Limit < 1 {
		return nil, badRequestf("limit must be at least 1")
	}
	if m.Limit > MaxLogLimit {
		m.Limit = MaxLogLimit
	}
	after, err := ResumeAfter(m.After, k.oldest, k.logID)
	if err != nil {
		return nil, err
	}
	page := &LogPage{Items: []LogItem{}, Next: after}
	if after >= k.logID {
		return page, nil
	}
	first := after + 1
	last := k.logID
	if uint64(m.Limit) < last-after {
		last = after + uint64(m.Limit)
	}
	prefix := k.ks.Key(kvLog, nil)
	size := 0
	err = o.st.scan(o.bg(), prefix, k.ks.KeyUint64(kvLog, first), k.ks.KeyUint64(kvLog, last+1), func(key, value []byte) (bool, error) {
		id := binary.BigEndian.Uint64(key[len(prefix):])
		var items []logItemJSON
		if err := json.Unmarshal(value, &items); err != nil {
			return false, fmt.Errorf("log entry %d: %w", id, err)
		}
		for _, it := range items {
			page.Items = append(page.Items, LogItem{Key: it.Key, Value: it.Value, LogID: id})
		}
		page.Next = id
		size += len(value)
		return m.MaxBytes <= 0 || size < m.MaxBytes, nil
	})
	if err != nil {
		return nil, unavailable("cannot read the change log", err)
	}
	return page, nil
}

func (o *object) idemLookup(k *kvState, key string, now time.Time) (idemRecord, bool, error) {
	var rec idemRecord
	raw, found, err := o.st.get(o.bg(), k.ks.KeyString(kvIdem, key))
	if err != nil {
		return rec, false, unavailable("cannot read the idempotency record", err)
	}
	if !found {
		return rec, false, nil
	}
	if err := json.Unmarshal(raw, &rec); err != nil {
		return rec, false, &Error{Kind: KindInternal, Msg: "internal error", cause: err}
	}
	if rec.ExpiresAt <= now.UnixMilli() {
		return rec, false, nil
	}
	return rec, true, nil
}

// idemSweep bounds how many expired idempotency records one write removes.
const idemSweep = 16

// idemStage adds the record of key to w, and removes up to idemSweep expired
// records, oldest first.
func (o *object) idemStage(k *kvState, w *persistence.Write, key string, rec idemRecord, now time.Time) error {
	val, err := json.Marshal(rec)
	if err != nil {
		return &Error{Kind: KindInternal, Msg: "internal error", cause: err}
	}
	recKey := k.ks.KeyString(kvIdem, key)
	// A record replaced after expiry leaves its old index entry: the sweep below
	// finds it and, seeing a newer expiry in the record, deletes only the index.
	w.Sets = append(w.Sets,
		persistence.KV{Key: recKey, Value: val},
		persistence.KV{Key: idemExpKey(k, rec.ExpiresAt, key)})
	prefix := k.ks.Key(kvIdemExp, nil)
	end := k.ks.KeyUint64(kvIdemExp, uint64(now.UnixMilli())+1)
	n := 0
	return o.st.scan(o.bg(), prefix, nil, end, func(ik, _ []byte) (bool, error) {
		rest := ik[len(prefix):]
		exp, name := int64(binary.BigEndian.Uint64(rest)), string(rest[8:])
		w.Deletes = append(w.Deletes, append([]byte(nil), ik...))
		if name != key {
			cur, found, err := o.st.get(o.bg(), k.ks.KeyString(kvIdem, name))
			if err != nil {
				return false, err
			}
			var r idemRecord
			if found && json.Unmarshal(cur, &r) == nil && r.ExpiresAt == exp {
				w.Deletes = append(w.Deletes, k.ks.KeyString(kvIdem, name))
			}
		}
		n++
		return n < idemSweep, nil
	})
}

func idemExpKey(k *kvState, exp int64, key string) []byte {
	b := k.ks.KeyUint64(kvIdemExp, uint64(exp))
	return append(b, key...)
}
