// Package holdfast embeds a Holdfast node in a Go program: durable objects with KV
// slots, a change log and user-defined message handlers, on local disk, with no
// network and no other service.
//
//	rt, err := holdfast.Open(holdfast.Options{DataDir: "./data"})
//	defer rt.Close(ctx)
//	obj := rt.Object("app_demo", "order", "order-42")
//	res, err := obj.Set(ctx, "status", "shipped")   // durable when it returns
//
// The same operations are served over HTTP by `holdfast serve` (package gateway).
package holdfast

import (
	"context"
	"log/slog"
	"time"

	"github.com/holdfast/holdfast/actors"
	"github.com/holdfast/holdfast/cluster"
	"github.com/holdfast/holdfast/cold"
	"github.com/holdfast/holdfast/internal/slogx"
	"github.com/holdfast/holdfast/internal/storetune"
)

// Re-exported so that an embedding program imports one package.
type (
	// ObjectID names an object: (app, type, key).
	ObjectID = actors.ObjectID
	// Object is the KV API of one object.
	Object = actors.KV
	// TypeSpec is a user-defined object type.
	TypeSpec = actors.TypeSpec
	// Context is a user handler's view of its object during one turn.
	Context = actors.Context
	// Op is one operation of a transaction.
	Op = actors.Op
	// PatchEntry is one slot of a Patch.
	PatchEntry = actors.PatchEntry
	// TypeOptions are an object type's options.
	TypeOptions = actors.TypeOptions
	// LogOptions are an object type's retained-log options.
	LogOptions = actors.LogOptions
	// LeaseOptions turn a log type's leases on.
	LeaseOptions = actors.LeaseOptions
	// Lease is a claimed range of a log.
	Lease = actors.Lease
	// Log is the API of one object's retained log.
	Log = actors.Log
	// LogInput is one record to append.
	LogInput = actors.LogInput
	// LogRecord is one record of a log.
	LogRecord = actors.LogRecord
	// OffsetTruncatedError says a log no longer holds an offset.
	OffsetTruncatedError = actors.OffsetTruncatedError
	// Alarms is the API of one object's durable alarms.
	Alarms = actors.Alarms
	// AlarmHandler runs a fired alarm in its object's turn (TypeSpec.Alarms).
	AlarmHandler = actors.AlarmHandler
	// Queue is the API of one object's write-ahead queue.
	Queue = actors.Queue
	// QueueOptions are a type's queue settings (TypeOptions.Queue).
	QueueOptions = actors.QueueOptions
	// QueueMessageIn is a message to enqueue; QueueDelivery one handed out.
	QueueMessageIn = actors.QueueMessageIn
	QueueDelivery  = actors.QueueDelivery
	// QueueReceive asks for due messages of one target (pull).
	QueueReceive = actors.QueueReceive
	// QueueHandler is a push consumer (TypeSpec.Queue); QueueResult its answer.
	QueueHandler = actors.QueueHandler
	QueueResult  = actors.QueueResult
	// AlarmCall is what an alarm handler receives.
	AlarmCall = actors.AlarmCall
	// AlarmInfo is one alarm's occurrence.
	AlarmInfo = actors.AlarmInfo
	// AlarmOptions are a type's alarm options.
	AlarmOptions = actors.AlarmOptions
)

// ErrLogTruncated matches every truncation error (errors.Is).
var ErrLogTruncated = actors.ErrLogTruncated

// ErrNotFound matches a missing slot, message or alarm (errors.Is).
var ErrNotFound = actors.ErrNotFound

// Options configure an embedded runtime.
type Options struct {
	// DataDir holds the database. Required.
	DataDir string
	// Partitions is fixed when DataDir is created; zero means 256 (or what DataDir holds).
	Partitions int
	// IdleTimeout passivates idle objects; zero means 60s.
	IdleTimeout time.Duration
	// Types are the user-defined object types.
	Types []TypeSpec
	// TypeOptions returns a type's options; nil means the defaults (10,000
	// change-log entries per object).
	TypeOptions func(typ string) TypeOptions
	// Logger; nil means slog.Default()'s handler at WARN and above: an
	// embedded node says nothing while all is well (its INFO lines, such as
	// the queue replay at start, are a server's).
	Logger *slog.Logger
	// Cold is where logs of types with cold storage keep trimmed records
	// (cold.NewMemory, cold/fs, cold/s3); nil means none.
	Cold cold.Store
	// TuneGOMAXPROCS raises GOMAXPROCS by cluster.ExtraProcs (unless the
	// GOMAXPROCS environment variable is set), as `holdfast serve` does: the
	// commit pipeline blocks a P in fdatasync, and with 2 cores and 1,000
	// writers 2 Ps kept 1.5 cores busy, 4 Ps 1.8 (cluster/procs.go). Off by
	// default: a library leaves the process's settings to the program.
	TuneGOMAXPROCS bool
	// Storage overrides storage sizes for this module's benchmarks and tests
	// (the type is internal: no other program can set it); nil means the
	// defaults.
	Storage *storetune.Config
}

// Runtime is an embedded Holdfast node.
type Runtime struct {
	node *cluster.Node
}

// Open starts a runtime on opts.DataDir.
func Open(opts Options) (*Runtime, error) {
	if opts.Logger == nil {
		opts.Logger = slog.New(slogx.MinLevel(slog.Default().Handler(), slog.LevelWarn))
	}
	if opts.TuneGOMAXPROCS {
		cluster.TuneGOMAXPROCS(opts.Logger)
	}
	n, err := cluster.Start(cluster.Config{
		DataDir:     opts.DataDir,
		Partitions:  opts.Partitions,
		IdleTimeout: opts.IdleTimeout,
		Types:       opts.Types,
		TypeOptions: opts.TypeOptions,
		Logger:      opts.Logger,
		Cold:        opts.Cold,
		Storage:     opts.Storage,
	})
	if err != nil {
		return nil, err
	}
	return &Runtime{node: n}, nil
}

// Object returns the KV API of object (app, typ, key).
func (r *Runtime) Object(app, typ, key string) *Object {
	return actors.NewKV(r.node, ObjectID{App: app, Type: typ, Key: key})
}

// Log returns the retained log of object (app, typ, key).
func (r *Runtime) Log(app, typ, key string) *Log {
	return actors.NewLog(r.node, ObjectID{App: app, Type: typ, Key: key})
}

// Queue returns the write-ahead queue of object (app, typ, key).
func (r *Runtime) Queue(app, typ, key string) *Queue {
	return actors.NewQueue(r.node, ObjectID{App: app, Type: typ, Key: key})
}

// Alarms returns the durable alarms of object (app, typ, key).
func (r *Runtime) Alarms(app, typ, key string) *Alarms {
	return actors.NewAlarms(r.node, ObjectID{App: app, Type: typ, Key: key})
}

// Request sends msg to object (app, typ, key) and returns the reply of its type's
// handler. The reply arrives only once every write the object made before it is
// durable.
func (r *Runtime) Request(ctx context.Context, app, typ, key string, msg any) (any, error) {
	return r.node.Request(ctx, ObjectID{App: app, Type: typ, Key: key}, msg)
}

// Node returns the underlying node (for servers and statistics).
func (r *Runtime) Node() *cluster.Node { return r.node }

// Close lets admitted requests finish and closes the database.
func (r *Runtime) Close(ctx context.Context) error { return r.node.Close(ctx) }
