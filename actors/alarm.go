package actors

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"runtime/debug"
	"sort"
	"strings"
	"time"

	"github.com/holdfast/holdfast/alarms"
	"github.com/holdfast/holdfast/persistence"
)

// Alarms (spec/alarms.md) are a behaviour of the object actor. The object's
// keyspace under behaviourAlarm holds
//
//	'r' | name   the name's occurrence (JSON alarmRec): pending or failed
//	'g'          the generation counter (u64 BE); it never goes back, so an
//	             idempotency key is never reused, even after a delete
//
// and a pending occurrence also has an entry in its partition's alarm index
// (package alarms), written in the same commit. The node's scheduler reads the
// index and wakes the object with alarmFire; the object checks the wake-up
// against its record, so stale and repeated wake-ups do nothing.
const (
	alarmRecord byte = 'r'
	alarmGen    byte = 'g'
)

type alarmRec struct {
	At        int64           `json:"at"`        // next fire time (unix ms)
	Scheduled int64           `json:"scheduled"` // the occurrence's time
	Gen       uint64          `json:"gen"`
	Attempt   int             `json:"attempt,omitempty"`
	Failed    bool            `json:"failed,omitempty"`
	LastError string          `json:"lastError,omitempty"`
	Action    json.RawMessage `json:"action,omitempty"`
}

type alarmState struct {
	ks      persistence.Keyspace
	recs    map[string]*alarmRec
	gen     uint64            // the last generation handed out
	running map[string]uint64 // name -> generation of a handler still running (async actions)
	// users counts the names in recs that clients may schedule (not reserved):
	// the names the type's alarms.maxPerObject caps. alarmWrite keeps it.
	users int
}

// alarmFire is the scheduler's wake-up for one index entry.
type alarmFire struct{ d alarms.Due }

var trimAction = json.RawMessage(`{"kind":"trim"}`)

// maxLastError bounds the error text an occurrence keeps.
const maxLastError = 1024

func (o *object) alarmLoad() (*alarmState, error) {
	if o.alarms != nil {
		return o.alarms, nil
	}
	a := &alarmState{ks: persistence.NewKeyspace(o.part, o.act.id, behaviourAlarm), recs: map[string]*alarmRec{}, running: map[string]uint64{}}
	n := len(a.ks.Prefix())
	err := o.st.scan(o.bg(), a.ks.Prefix(), nil, nil, func(k, v []byte) (bool, error) {
		switch k[n] {
		case alarmGen:
			if len(v) != 8 {
				return false, fmt.Errorf("alarm generation of %d bytes", len(v))
			}
			a.gen = binary.BigEndian.Uint64(v)
		case alarmRecord:
			r := &alarmRec{}
			if err := json.Unmarshal(v, r); err != nil {
				return false, fmt.Errorf("alarm %q: %w", k[n+1:], err)
			}
			a.recs[string(k[n+1:])] = r
			if !reservedAlarm(string(k[n+1:])) {
				a.users++
			}
		}
		return true, nil
	})
	if err != nil {
		return nil, unavailable("cannot read the object's alarms", err)
	}
	o.alarms = a
	return a, nil
}

func (o *object) due(name string, r *alarmRec) alarms.Due {
	return alarms.Due{At: r.At, Partition: o.part, ID: o.act.id, Name: name, Gen: r.Gen}
}

// alarmWrite adds to w the change of name's occurrence from old to next (nil:
// none) and records it in memory. It returns the index entry to notify once w is
// durable, if next is pending.
func (o *object) alarmWrite(a *alarmState, w *persistence.Write, name string, old, next *alarmRec) *alarms.Due {
	id := o.act.id
	if !reservedAlarm(name) {
		switch had := a.recs[name] != nil; {
		case had && next == nil:
			a.users--
		case !had && next != nil:
			a.users++
		}
	}
	if old != nil && !old.Failed && (next == nil || next.Failed || next.At != old.At) {
		w.Deletes = append(w.Deletes, alarms.IndexKey(o.part, old.At, id, name))
	}
	if next == nil {
		w.Deletes = append(w.Deletes, a.ks.KeyString(alarmRecord, name))
		delete(a.recs, name)
		return nil
	}
	v, _ := json.Marshal(next)
	w.Sets = append(w.Sets, persistence.KV{Key: a.ks.KeyString(alarmRecord, name), Value: v})
	a.recs[name] = next
	if next.Failed {
		return nil
	}
	w.Sets = append(w.Sets, persistence.KV{Key: alarms.IndexKey(o.part, next.At, id, name), Value: alarms.IndexValue(next.Gen)})
	d := o.due(name, next)
	return &d
}

// newGen hands out the next generation and adds the counter to w.
func (a *alarmState) newGen(w *persistence.Write) uint64 {
	a.gen++
	w.Sets = append(w.Sets, persistence.KV{Key: a.ks.Key(alarmGen, nil), Value: binary.BigEndian.AppendUint64(nil, a.gen)})
	return a.gen
}

// alarmNotify tells the scheduler about ds once every write so far is durable.
func (o *object) alarmNotify(ds []alarms.Due) {
	if len(ds) == 0 || o.h.sched == nil {
		return
	}
	s := o.h.sched
	o.gate(func() {
		for _, d := range ds {
			s.Notify(d)
		}
	}, func(error) {}) // lost: the write never happened, there is nothing to fire
}

// checkAlarm validates a schedule request. internal allows the reserved names.
func (o *object) checkAlarm(name string, at int64, action json.RawMessage, internal bool) error {
	if err := checkAlarmName(name); err != nil {
		return err
	}
	switch {
	case !internal && strings.HasPrefix(name, ReservedAlarmPrefix):
		return invalidf("alarm names starting with %q are reserved for the runtime", ReservedAlarmPrefix)
	case at < 0 || at > maxAlarmTime:
		return badRequestf("alarm time %d is out of range (unix milliseconds, 0 to %d)", at, int64(maxAlarmTime))
	}
	if action == nil {
		if o.typ == nil || o.typ.Alarms[name] == nil {
			return invalidf("type %q registers no handler for alarm %q: give it an action", o.act.id.Type, name)
		}
		return nil
	}
	_, err := parseAlarmAction(action)
	return err
}

const maxAlarmTime = 253402300799999 // 9999-12-31T23:59:59.999Z

// parseAlarmAction checks an action and returns its kind.
func parseAlarmAction(action json.RawMessage) (string, error) {
	if len(action) > MaxAlarmAction {
		return "", tooLargef("alarm action is %d bytes, at most %d", len(action), MaxAlarmAction)
	}
	var a struct {
		Kind *string `json:"kind"`
	}
	if err := json.Unmarshal(action, &a); err != nil || a.Kind == nil || !bytes.HasPrefix(bytes.TrimSpace(action), []byte("{")) {
		return "", badRequestf(`alarm action must be a JSON object with a "kind"`)
	}
	switch *a.Kind {
	case "trim":
		return *a.Kind, nil
	case "enqueue":
		if _, err := parseEnqueueAction(action); err != nil {
			return "", err
		}
		return *a.Kind, nil
	}
	return "", invalidf("unknown alarm action kind %q (want \"trim\" or \"enqueue\")", *a.Kind)
}

// compactAction returns a checked action without insignificant whitespace.
func compactAction(v json.RawMessage) json.RawMessage {
	if v == nil {
		return nil
	}
	c, err := compactJSON(v)
	if err != nil {
		return append(json.RawMessage(nil), v...)
	}
	return c
}

func (o *object) alarmSet(m AlarmSet) (any, error) {
	if err := o.checkAlarm(m.Name, m.At, m.Action, false); err != nil {
		return nil, err
	}
	a, err := o.alarmLoad()
	if err != nil {
		return nil, err
	}
	if a.recs[m.Name] == nil && a.users >= o.maxAlarms() {
		return nil, o.alarmLimitError()
	}
	w := &persistence.Write{}
	next := &alarmRec{At: m.At, Scheduled: m.At, Gen: a.newGen(w), Action: compactAction(m.Action)}
	d := o.alarmWrite(a, w, m.Name, a.recs[m.Name], next)
	o.submit(w, nil)
	o.alarmNotify([]alarms.Due{*d})
	return &AlarmScheduled{Name: m.Name, At: m.At, Generation: next.Gen}, nil
}

func (o *object) info(name string, r *alarmRec) AlarmInfo {
	st := AlarmPending
	if r.Failed {
		st = AlarmFailed
	}
	return AlarmInfo{Name: name, At: r.At, ScheduledTime: r.Scheduled, Action: r.Action, Status: st, Attempt: r.Attempt,
		LastError: r.LastError, IdempotencyKey: alarms.IdempotencyKey(o.act.id, name, r.Gen), Generation: r.Gen}
}

// checkAlarmName checks a name by the rule of every name (checkUserName).
func checkAlarmName(name string) error {
	if err := checkUserName("alarm name", name, MaxAlarmName, "/"); err != nil {
		return err
	}
	return nil
}

// alarmNamed returns the object's alarms and name's occurrence, or not found.
func (o *object) alarmNamed(name string) (*alarmState, *alarmRec, error) {
	if err := checkAlarmName(name); err != nil {
		return nil, nil, err
	}
	a, err := o.alarmLoad()
	if err != nil {
		return nil, nil, err
	}
	r := a.recs[name]
	if r == nil {
		return nil, nil, notFoundf("no alarm %q", name)
	}
	return a, r, nil
}

func (o *object) alarmGet(m AlarmGet) (any, error) {
	_, r, err := o.alarmNamed(m.Name)
	if err != nil {
		return nil, err
	}
	info := o.info(m.Name, r)
	return &info, nil
}

func (o *object) alarmDelete(m AlarmDelete) (any, error) {
	a, r, err := o.alarmNamed(m.Name)
	if err != nil {
		return nil, err
	}
	w := &persistence.Write{}
	o.alarmWrite(a, w, m.Name, r, nil)
	o.submit(w, nil)
	return nil, nil
}

// alarmList returns one page of the object's alarms in (At, Name) order: those
// after m.After, at most m.Limit of them, and fewer once their estimated JSON
// reaches AlarmPageBytes (always at least one). Paging is by position, not by
// snapshot: an alarm that moves (a retry, a replacement) between two pages may
// be listed twice or not at all; one that stays put is listed exactly once.
func (o *object) alarmList(m AlarmListGet) (any, error) {
	var after *alarmCursor
	if m.After != "" {
		c, err := parseAlarmCursor(m.After)
		if err != nil {
			return nil, err
		}
		after = &c
	}
	limit := m.Limit
	if limit <= 0 {
		limit = DefaultAlarmPageLimit
	}
	limit = min(limit, MaxAlarmPageLimit)
	a, err := o.alarmLoad()
	if err != nil {
		return nil, err
	}
	all := o.sortedAlarms(a.recs)
	start := 0
	if after != nil {
		start = sort.Search(len(all), func(i int) bool { return after.before(all[i].At, all[i].Name) })
	}
	end, size := start, 0
	for end < len(all) && end-start < limit {
		n := alarmJSONSize(&all[end])
		if end > start && size+n > AlarmPageBytes {
			break
		}
		size += n
		end++
	}
	page := &AlarmList{Alarms: all[start:end:end]}
	if end < len(all) {
		last := all[end-1]
		page.Next = alarmCursor{at: last.At, name: last.Name}.String()
	}
	return page, nil
}

// maxAlarms is the type's cap on an object's schedulable alarm names.
func (o *object) maxAlarms() int {
	if n := o.opts.Alarms.MaxPerObject; n > 0 {
		return n
	}
	return DefaultMaxAlarms
}

func (o *object) alarmLimitError() *Error {
	return &Error{Kind: KindInvalid, Code: ErrAlarmLimit.Code, Msg: fmt.Sprintf(
		"the object already has %d alarms, the most its type allows: delete one, reuse a name, "+
			"or raise types.%s.alarms.maxPerObject", o.maxAlarms(), o.act.id.Type)}
}

// reservedAlarm reports whether name belongs to the runtime.
func reservedAlarm(name string) bool { return strings.HasPrefix(name, ReservedAlarmPrefix) }

func (o *object) sortedAlarms(recs map[string]*alarmRec) []AlarmInfo {
	out := make([]AlarmInfo, 0, len(recs))
	for name, r := range recs {
		if r != nil {
			out = append(out, o.info(name, r))
		}
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].At != out[j].At {
			return out[i].At < out[j].At
		}
		return out[i].Name < out[j].Name
	})
	return out
}

// alarmFire runs the occurrence the scheduler woke the object for, if it is still
// the current one, due, and not already running.
func (o *object) alarmFire(m alarmFire) (any, error) {
	a, err := o.alarmLoad()
	if err != nil {
		o.h.retryAlarm(m.d)
		return nil, err
	}
	name := m.d.Name
	r := a.recs[name]
	now := o.h.now().UnixMilli()
	if r == nil || r.Gen != m.d.Gen || r.Failed || r.At > now {
		return nil, nil // replaced, deleted, failed, or moved to a later retry
	}
	if _, busy := a.running[name]; busy {
		return nil, nil // its predecessor is running; it wakes this one when it ends
	}
	if f := o.h.cfg.Hooks.AlarmRan; f != nil {
		f(time.Duration(now-r.At) * time.Millisecond)
	}
	if name == QueueAlarm {
		o.alarmSettle(a, name, r.Gen, nil, nil, 0)
		o.queueCompact() // each re-arms the alarm for its next need
		o.queuePump()
		return nil, nil
	}
	call := AlarmCall{Name: name, ScheduledTime: time.UnixMilli(r.Scheduled), Attempt: r.Attempt,
		IdempotencyKey: alarms.IdempotencyKey(o.act.id, name, r.Gen), Action: r.Action}
	if r.Action != nil {
		return o.alarmAction(a, name, r, call)
	}
	var handler AlarmHandler
	if o.typ != nil {
		handler = o.typ.Alarms[name]
	}
	if handler == nil {
		o.alarmSettle(a, name, r.Gen, nil, fmt.Errorf("type %q registers no handler for alarm %q", o.act.id.Type, name), 0)
		return nil, nil
	}
	c := &Context{o: o, ks: persistence.NewKeyspace(o.part, o.act.id, behaviourUser)}
	if err := o.runAlarmHandler(handler, c, call); err != nil {
		o.alarmSettle(a, name, r.Gen, nil, err, 0)
		return nil, nil
	}
	o.alarmSettle(a, name, r.Gen, c, nil, 0)
	return nil, nil
}

// runAlarmHandler runs a Go handler; a panic is an error like any other.
func (o *object) runAlarmHandler(h AlarmHandler, c *Context, call AlarmCall) (err error) {
	defer func() {
		if r := recover(); r != nil {
			o.h.log.Error("alarm handler panicked", "object", o.act.id.String(), "alarm", call.Name, "panic", fmt.Sprint(r), "stack", string(debug.Stack()))
			err = fmt.Errorf("panic: %v", r)
		}
	}()
	return h(c, call)
}

// alarmAction runs an occurrence's action. A trim of a cold log ends in a later
// turn; until then the name counts as running.
func (o *object) alarmAction(a *alarmState, name string, r *alarmRec, call AlarmCall) (any, error) {
	kind, err := parseAlarmAction(r.Action)
	if err != nil {
		o.alarmSettle(a, name, r.Gen, nil, err, 0)
		return nil, nil
	}
	switch kind {
	case "enqueue":
		o.alarmEnqueue(a, name, r, call)
		return nil, nil
	case "trim":
		env := o.deferReply()
		gen := r.Gen
		a.running[name] = gen
		o.trim(func(_ *LogTrimmed, err error) {
			delete(a.running, name)
			var rearm time.Duration
			if err == nil && name == TrimAlarm && o.autoTrim() && o.log != nil && o.log.hot < o.log.next {
				rearm = o.opts.Log.TrimEvery // re-armed only while something is hot
			}
			o.alarmSettle(a, name, gen, nil, err, rearm)
			// A replacement scheduled while this one ran waited for it.
			if cur := a.recs[name]; cur != nil && !cur.Failed && cur.Gen != gen {
				o.alarmNotify([]alarms.Due{o.due(name, cur)})
			}
			o.respond(env, nil, nil)
		})
		return nil, nil
	}
	return nil, nil
}

// alarmSettle commits the end of an attempt of occurrence gen of name: with the
// handler's writes (c) on success, removing the occurrence unless it was
// replaced meanwhile (or rearm says to schedule the next one); on failure, a
// retry after backoff, or the failed status after MaxAttempts.
func (o *object) alarmSettle(a *alarmState, name string, gen uint64, c *Context, herr error, rearm time.Duration) {
	o.alarmSettleWith(a, name, gen, c, herr, rearm, nil)
}

// alarmSettleWith is alarmSettle committing extra (an action's writes) in the
// same commit when the attempt succeeded.
func (o *object) alarmSettleWith(a *alarmState, name string, gen uint64, c *Context, herr error, rearm time.Duration, extra *persistence.Write) {
	w := &persistence.Write{}
	var notify []alarms.Due
	if herr == nil && c != nil {
		notify = c.stage(w)
	}
	if herr == nil && extra != nil {
		w.Sets = append(w.Sets, extra.Sets...)
		w.Deletes = append(w.Deletes, extra.Deletes...)
	}
	if cur := a.recs[name]; cur != nil && cur.Gen == gen {
		now := o.h.now()
		var next *alarmRec
		switch {
		case herr == nil && rearm > 0:
			at := now.Add(rearm).UnixMilli()
			next = &alarmRec{At: at, Scheduled: at, Gen: a.newGen(w), Action: cur.Action}
		case herr == nil:
		default:
			n := *cur
			next = &n
			next.Attempt++
			next.LastError = herr.Error()
			if len(next.LastError) > maxLastError {
				next.LastError = next.LastError[:maxLastError]
			}
			if next.Attempt >= o.maxAlarmAttempts() {
				next.Failed = true
				o.h.log.Warn("alarm failed after its last attempt", "object", o.act.id.String(), "alarm", name, "attempts", next.Attempt, "err", herr)
			} else {
				next.At = now.Add(alarms.Backoff(next.Attempt, rand.Float64())).UnixMilli()
				o.h.log.Log(o.bg(), slog.LevelDebug, "alarm attempt failed; retrying", "object", o.act.id.String(), "alarm", name, "attempt", cur.Attempt, "err", herr)
			}
		}
		if d := o.alarmWrite(a, w, name, cur, next); d != nil {
			notify = append(notify, *d)
		}
	}
	if len(w.Sets)+len(w.Deletes) > 0 {
		o.submit(w, nil)
	}
	o.alarmNotify(notify)
}

func (o *object) maxAlarmAttempts() int {
	if n := o.opts.Alarms.MaxAttempts; n > 0 {
		return n
	}
	return alarms.DefaultMaxAttempts
}

// autoTrim reports whether the object's log keeps the automatic trim alarm.
func (o *object) autoTrim() bool {
	l := o.opts.Log
	return l.TrimEvery > 0 && (l.MaxAge > 0 || l.MaxRecords > 0 || l.MaxBytes > 0)
}

// armTrim adds the automatic trim alarm to w (an append) unless it is pending.
func (o *object) armTrim(w *persistence.Write) (*alarms.Due, error) {
	a, err := o.alarmLoad()
	if err != nil {
		return nil, err
	}
	old := a.recs[TrimAlarm]
	if old != nil && !old.Failed {
		return nil, nil
	}
	at := o.h.now().Add(o.opts.Log.TrimEvery).UnixMilli()
	return o.alarmWrite(a, w, TrimAlarm, old, &alarmRec{At: at, Scheduled: at, Gen: a.newGen(w), Action: trimAction}), nil
}

// Alarms inside a turn: Context stages them with its storage writes, and they
// commit together.

func (c *Context) alarmView(name string) (*alarmRec, error) {
	if r, ok := c.alarmOps[name]; ok {
		return r, nil
	}
	a, err := c.o.alarmLoad()
	if err != nil {
		return nil, err
	}
	return a.recs[name], nil
}

// SetAlarm schedules alarm name of this object at at, in this turn's transaction
// (see AlarmSet). It returns the new occurrence's generation.
func (c *Context) SetAlarm(name string, at time.Time, action json.RawMessage) (uint64, error) {
	if err := c.o.checkAlarm(name, at.UnixMilli(), action, false); err != nil {
		return 0, err
	}
	a, err := c.o.alarmLoad()
	if err != nil {
		return 0, err
	}
	if cur, err := c.alarmView(name); err != nil {
		return 0, err
	} else if cur == nil && c.alarmUsers(a) >= c.o.maxAlarms() {
		return 0, c.o.alarmLimitError()
	}
	if c.alarmOps == nil {
		c.alarmOps = map[string]*alarmRec{}
		c.alarmGen = a.gen
	}
	c.alarmGen++
	c.alarmOps[name] = &alarmRec{At: at.UnixMilli(), Scheduled: at.UnixMilli(), Gen: c.alarmGen, Action: compactAction(action)}
	return c.alarmGen, nil
}

// alarmUsers counts the schedulable names this turn sees. Only a turn that
// stages many alarms near the cap pays for the walk over its staged ones.
func (c *Context) alarmUsers(a *alarmState) int {
	if a.users+len(c.alarmOps) < c.o.maxAlarms() {
		return a.users // a lower bound is enough: under the cap either way
	}
	n := a.users
	for name, r := range c.alarmOps {
		if reservedAlarm(name) {
			continue
		}
		switch had := a.recs[name] != nil; {
		case had && r == nil:
			n--
		case !had && r != nil:
			n++
		}
	}
	return n
}

// GetAlarm returns alarm name as this turn sees it.
func (c *Context) GetAlarm(name string) (*AlarmInfo, bool, error) {
	r, err := c.alarmView(name)
	if err != nil || r == nil {
		return nil, false, err
	}
	info := c.o.info(name, r)
	return &info, true, nil
}

// DeleteAlarm deletes alarm name in this turn's transaction; false if none.
func (c *Context) DeleteAlarm(name string) (bool, error) {
	r, err := c.alarmView(name)
	if err != nil || r == nil {
		return false, err
	}
	if c.alarmOps == nil {
		c.alarmOps = map[string]*alarmRec{}
		c.alarmGen = c.o.alarms.gen
	}
	c.alarmOps[name] = nil
	return true, nil
}

// ListAlarms returns the object's alarms as this turn sees them, ordered by At.
func (c *Context) ListAlarms() ([]AlarmInfo, error) {
	a, err := c.o.alarmLoad()
	if err != nil {
		return nil, err
	}
	recs := make(map[string]*alarmRec, len(a.recs)+len(c.alarmOps))
	for k, v := range a.recs {
		recs[k] = v
	}
	for k, v := range c.alarmOps {
		recs[k] = v
	}
	return c.o.sortedAlarms(recs), nil
}

// stage adds the turn's storage writes and alarm changes to w, applies the alarm
// changes in memory, and returns the index entries to notify once w is durable.
func (c *Context) stage(w *persistence.Write) []alarms.Due {
	for _, k := range c.order {
		key := c.ks.KeyString(userData, k)
		if v := c.writes[k]; v != nil {
			w.Sets = append(w.Sets, persistence.KV{Key: key, Value: *v})
		} else {
			w.Deletes = append(w.Deletes, key)
		}
	}
	if len(c.alarmOps) == 0 {
		return nil
	}
	a := c.o.alarms // loaded by the calls that staged
	names := make([]string, 0, len(c.alarmOps))
	for name := range c.alarmOps {
		names = append(names, name)
	}
	sort.Strings(names)
	var notify []alarms.Due
	for _, name := range names {
		if d := c.o.alarmWrite(a, w, name, a.recs[name], c.alarmOps[name]); d != nil {
			notify = append(notify, *d)
		}
	}
	if c.alarmGen > a.gen {
		a.gen = c.alarmGen - 1
		a.newGen(w)
	}
	return notify
}
