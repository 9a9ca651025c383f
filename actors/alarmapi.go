package actors

import (
	"context"
	"encoding/json"
	"time"
)

// Messages of the alarms behaviour (spec/alarms.md). Every object, of any type,
// owns named alarms; each name holds at most one pending occurrence.

// AlarmSet schedules alarm Name at At (unix ms), replacing its pending occurrence
// with a new generation at attempt 0. Action is what runs when it fires:
// {"kind":"trim"} trims the object's log; nil runs the Go handler the object's
// type registered for Name (TypeSpec.Alarms). Reply: *AlarmScheduled, once the
// alarm is durable.
type AlarmSet struct {
	Name   string
	At     int64
	Action json.RawMessage
}

// AlarmScheduled is the reply to AlarmSet.
type AlarmScheduled struct {
	Name       string `json:"name"`
	At         int64  `json:"at"`
	Generation uint64 `json:"generation"`
}

// AlarmGet reads one alarm. Reply: *AlarmInfo, or ErrNotFound.
type AlarmGet struct{ Name string }

// AlarmDelete deletes an alarm's occurrence, pending or failed. Reply: nil, or
// ErrNotFound.
type AlarmDelete struct{ Name string }

// AlarmListGet lists one page of the object's alarms ordered by At, ties by
// Name. Reply: *AlarmList. A page holds at most Limit alarms, and stops early
// once their JSON reaches about AlarmPageBytes (it always holds one, if any is
// left). Paging is by position: an alarm that stays put is listed exactly once
// across pages; one that moves between two of them (a retry, a replacement)
// may be listed twice or not at all.
type AlarmListGet struct {
	// After is the Next of the previous page; "" starts at the beginning. A
	// value no page returned is ErrBadRequest.
	After string
	// Limit bounds the page; zero (or less) means DefaultAlarmPageLimit, and it
	// is capped at MaxAlarmPageLimit.
	Limit int
}

// AlarmList is the reply to AlarmListGet.
type AlarmList struct {
	Alarms []AlarmInfo `json:"alarms"`
	// Next is the After of the next page; "" when this page is the last.
	Next string `json:"next,omitempty"`
}

// Alarm paging bounds (AlarmListGet).
const (
	DefaultAlarmPageLimit = 1000
	MaxAlarmPageLimit     = 1000
	// AlarmPageBytes is the reply size past which a page ends: 1,000 alarms
	// with 64 KiB actions would otherwise be a 64 MiB reply.
	AlarmPageBytes = 1 << 20
)

// Alarm statuses.
const (
	AlarmPending = "pending"
	AlarmFailed  = "failed"
)

// AlarmInfo is one alarm's occurrence.
type AlarmInfo struct {
	Name string `json:"name"`
	// At is when it fires next (unix ms): the scheduled time, or the time of the
	// next retry after a failed attempt.
	At int64 `json:"at"`
	// ScheduledTime is the time it was scheduled for (unix ms).
	ScheduledTime  int64           `json:"scheduledTime"`
	Action         json.RawMessage `json:"action,omitempty"`
	Status         string          `json:"status"`
	Attempt        int             `json:"attempt"`
	LastError      string          `json:"lastError"`
	IdempotencyKey string          `json:"idempotencyKey"`
	Generation     uint64          `json:"generation"`
}

// AlarmCall is what a handler receives when its alarm fires.
type AlarmCall struct {
	Name          string
	ScheduledTime time.Time
	// Attempt is 0 on the first run of the occurrence, 1 on the first retry, ...
	Attempt int
	// IdempotencyKey is the same for every attempt of one occurrence and differs
	// for every other occurrence.
	IdempotencyKey string
	Action         json.RawMessage
}

// AlarmHandler runs a fired alarm in the object's turn. Its storage writes, and
// the alarm's settlement, commit together: returning nil removes the occurrence
// (unless the handler scheduled the same name again), returning an error (or
// panicking) discards the writes and retries the occurrence with backoff. The
// handler must not block on slow I/O.
type AlarmHandler func(c *Context, a AlarmCall) error

// AlarmOptions are a type's alarm settings (spec/config.md, types.<name>.alarms).
type AlarmOptions struct {
	// MaxAttempts is how many attempts an occurrence gets before it is failed;
	// zero means 5.
	MaxAttempts int
	// MaxPerObject caps an object's alarm names, pending or failed, that
	// clients may schedule (the runtime's own, ReservedAlarmPrefix, are not
	// counted). Scheduling a new name at the cap fails with ErrAlarmLimit;
	// replacing a name always works. Zero means DefaultMaxAlarms.
	MaxPerObject int
}

// DefaultMaxAlarms is the default of AlarmOptions.MaxPerObject.
const DefaultMaxAlarms = 10_000

// ErrAlarmLimit matches (errors.Is) the error of scheduling a new alarm name on
// an object that holds AlarmOptions.MaxPerObject of them. It is also an
// ErrInvalid (HTTP 422, code invalid); its message names the limit and the
// configuration key that raises it.
var ErrAlarmLimit = &Error{Kind: KindInvalid, Code: "alarm_limit", Msg: "too many alarms on the object"}

// Limits of alarms.
const (
	MaxAlarmName   = 256
	MaxAlarmAction = 64 << 10
	// ReservedAlarmPrefix starts the names the runtime uses itself (the log's
	// automatic trim); clients cannot schedule them.
	ReservedAlarmPrefix = "holdfast:"
	// TrimAlarm is the alarm a log with retention and trimEvery keeps.
	TrimAlarm = ReservedAlarmPrefix + "trim"
)

// Alarms is the Go API of an object's alarms, over any Requester.
type Alarms struct {
	r  Requester
	id ObjectID
}

// NewAlarms returns the alarms API of object id.
func NewAlarms(r Requester, id ObjectID) *Alarms { return &Alarms{r: r, id: id} }

// Set schedules alarm name at at (see AlarmSet).
func (a *Alarms) Set(ctx context.Context, name string, at time.Time, action json.RawMessage) (*AlarmScheduled, error) {
	return request[*AlarmScheduled](ctx, a.r, a.id, AlarmSet{Name: name, At: at.UnixMilli(), Action: action})
}

// Get returns alarm name, or an error matching ErrNotFound.
func (a *Alarms) Get(ctx context.Context, name string) (*AlarmInfo, error) {
	return request[*AlarmInfo](ctx, a.r, a.id, AlarmGet{Name: name})
}

// Delete deletes alarm name; an error matching ErrNotFound if there is none.
func (a *Alarms) Delete(ctx context.Context, name string) error {
	_, err := a.r.Request(ctx, a.id, AlarmDelete{Name: name})
	return err
}

// List returns all the object's alarms ordered by At, following every page (see
// AlarmListGet for what a concurrent change does to it).
func (a *Alarms) List(ctx context.Context) ([]AlarmInfo, error) {
	var out []AlarmInfo
	after := ""
	for {
		l, err := a.ListPage(ctx, after, 0)
		if err != nil {
			return nil, err
		}
		out = append(out, l.Alarms...)
		if l.Next == "" {
			if out == nil {
				out = []AlarmInfo{}
			}
			return out, nil
		}
		after = l.Next
	}
}

// ListPage returns one page of the object's alarms (see AlarmListGet).
func (a *Alarms) ListPage(ctx context.Context, after string, limit int) (*AlarmList, error) {
	return request[*AlarmList](ctx, a.r, a.id, AlarmListGet{After: after, Limit: limit})
}
