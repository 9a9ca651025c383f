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

// AlarmList lists the object's alarms ordered by At. Reply: *AlarmList.
type AlarmListGet struct{}

// AlarmList is the reply to AlarmListGet.
type AlarmList struct {
	Alarms []AlarmInfo `json:"alarms"`
}

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
}

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

// List returns the object's alarms ordered by At.
func (a *Alarms) List(ctx context.Context) ([]AlarmInfo, error) {
	l, err := request[*AlarmList](ctx, a.r, a.id, AlarmListGet{})
	if err != nil {
		return nil, err
	}
	return l.Alarms, nil
}
