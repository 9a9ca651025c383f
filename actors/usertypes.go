package actors

import (
	"context"
	"sort"

	"github.com/holdfast/holdfast/persistence"
)

// TypeSpec is a user-defined object type: Go code that runs as the object's actor.
type TypeSpec struct {
	// Name is the object type: non-empty, at most 256 bytes, no ':' or '/'.
	Name string
	// Handle runs one message in the object's turn: one message at a time per
	// object, never concurrently. Its storage writes form one implicit transaction
	// that commits atomically through the node's commit pipeline if Handle returns
	// a nil error, and is discarded otherwise (or on a panic). The reply reaches the
	// caller only once that transaction, and every earlier write of the object, is
	// durable. Handle must not block on slow I/O.
	Handle func(c *Context, msg any) (reply any, err error)
	// Alarms are the type's alarm handlers by alarm name (spec/alarms.md): an
	// alarm scheduled without an action runs the handler of its name.
	Alarms map[string]AlarmHandler
	// Queue are the type's push consumers of its queues (spec/queue.md).
	Queue []QueueHandler
}

// userData is the sub-key of user storage in the behaviourUser keyspace.
const userData byte = 'd'

// Limits of user storage.
const (
	MaxStorageKeyBytes   = 1024
	MaxStorageValueBytes = 1 << 20
)

// Context is a handler's view of its object during one turn. It is valid only
// during the Handle call that received it.
type Context struct {
	o      *object
	ks     persistence.Keyspace
	writes map[string]*[]byte // key -> value; a nil pointer means deleted
	order  []string           // keys in first-write order
	// alarmOps are the alarms this turn set (or deleted: nil), by name, and
	// alarmGen the last generation it handed out.
	alarmOps map[string]*alarmRec
	alarmGen uint64
}

// ID returns the object's name.
func (c *Context) ID() ObjectID { return c.o.act.id }

// Context returns a context for storage calls. It ends when the node closes
// and stops waiting for the requests in flight.
func (c *Context) Context() context.Context { return c.o.h.bg.Context() }

func checkStorageKey(key string) error {
	if key == "" || len(key) > MaxStorageKeyBytes {
		return badRequestf("storage key must be 1 to %d bytes", MaxStorageKeyBytes)
	}
	return nil
}

// Get returns the value at key as seen by this turn (its own writes included).
func (c *Context) Get(key string) ([]byte, bool, error) {
	if err := checkStorageKey(key); err != nil {
		return nil, false, err
	}
	if v, ok := c.writes[key]; ok {
		if v == nil {
			return nil, false, nil
		}
		return append([]byte(nil), (*v)...), true, nil
	}
	v, found, err := c.o.st.get(c.Context(), c.ks.KeyString(userData, key))
	if err != nil {
		return nil, false, unavailable("storage read failed", err)
	}
	return append([]byte(nil), v...), found, nil
}

// Put sets key to value in this turn's transaction.
func (c *Context) Put(key string, value []byte) error {
	if err := checkStorageKey(key); err != nil {
		return err
	}
	if len(value) > MaxStorageValueBytes {
		return tooLargef("storage value is %d bytes, at most %d", len(value), MaxStorageValueBytes)
	}
	v := append([]byte{}, value...)
	c.note(key, &v)
	return nil
}

// Delete removes key in this turn's transaction.
func (c *Context) Delete(key string) error {
	if err := checkStorageKey(key); err != nil {
		return err
	}
	c.note(key, nil)
	return nil
}

func (c *Context) note(key string, v *[]byte) {
	if c.writes == nil {
		c.writes = make(map[string]*[]byte)
	}
	if _, seen := c.writes[key]; !seen {
		c.order = append(c.order, key)
	}
	c.writes[key] = v
}

// List calls fn for every key with prefix, in key order, as seen by this turn,
// until fn returns false.
func (c *Context) List(prefix string, fn func(key string, value []byte) bool) error {
	base := c.ks.Key(userData, nil)
	var mine []string
	for k := range c.writes {
		if len(k) >= len(prefix) && k[:len(prefix)] == prefix {
			mine = append(mine, k)
		}
	}
	sort.Strings(mine)
	stop := false
	emit := func(limit string, all bool) {
		for len(mine) > 0 && !stop && (all || mine[0] < limit) {
			k := mine[0]
			mine = mine[1:]
			if v := c.writes[k]; v != nil && !fn(k, append([]byte(nil), (*v)...)) {
				stop = true
			}
		}
	}
	err := c.o.st.scan(c.Context(), c.ks.KeyString(userData, prefix), nil, nil, func(key, value []byte) (bool, error) {
		name := string(key[len(base):])
		emit(name, false)
		if stop {
			return false, nil
		}
		if _, overwritten := c.writes[name]; overwritten {
			return true, nil
		}
		if !fn(name, append([]byte(nil), value...)) {
			stop = true
		}
		return !stop, nil
	})
	if err != nil {
		return unavailable("storage read failed", err)
	}
	emit("", true)
	return nil
}

// runUser runs a user handler as one implicit transaction.
func (o *object) runUser(msg any) (reply any, err error) {
	if o.typ.Handle == nil {
		return nil, notFoundf("object type %q has no handler for %T", o.act.id.Type, msg)
	}
	c := &Context{o: o, ks: persistence.NewKeyspace(o.part, o.act.id, behaviourUser)}
	reply, err = o.typ.Handle(c, msg)
	if err != nil {
		return nil, err
	}
	w := &persistence.Write{}
	notify := c.stage(w)
	if len(w.Sets)+len(w.Deletes) > 0 {
		o.submit(w, nil)
	}
	o.alarmNotify(notify)
	return reply, nil
}

// LogAppend appends records to the object's own retained log, at once, as its own
// durable commit: it is not part of the turn's storage transaction (a handler
// that fails afterwards does not take it back). The reply of the turn still
// waits for it. Cold reads and trims of cold logs are not available here (they
// reply from outside the turn): send LogRead or LogTrim to the object instead.
func (c *Context) LogAppend(records ...LogInput) ([]uint64, error) {
	v, err := c.o.logAppend(LogAppend{Records: records})
	if err != nil {
		return nil, err
	}
	return v.(*LogAppended).Offsets, nil
}

// LogBounds returns the object's log bounds.
func (c *Context) LogBounds() (*LogBounds, error) {
	v, err := c.o.logBounds()
	if err != nil {
		return nil, err
	}
	return v.(*LogBounds), nil
}

// LogReadHot reads the object's log from a hot offset (from >= HotOffset).
func (c *Context) LogReadHot(from uint64, limit int) (*RecordPage, error) {
	l, err := c.o.logLoad()
	if err != nil {
		return nil, err
	}
	if from < l.hot {
		return nil, invalidf("offset %d is below the hot window (%d): send LogRead to the object", from, l.hot)
	}
	v, err := c.o.logRead(LogRead{From: from, Limit: limit})
	if err != nil {
		return nil, err
	}
	return v.(*RecordPage), nil
}

// LogCommit moves a consumer's cursor forward (see LogCommit).
func (c *Context) LogCommit(consumer string, offset uint64) (uint64, error) {
	v, err := c.o.logCommit(LogCommit{Consumer: consumer, Offset: offset})
	if err != nil {
		return 0, err
	}
	return v.(*LogCursor).Offset, nil
}
