// Package metrics is a node's Prometheus metrics (GET /metrics). It owns the
// collectors; the other packages report through small hook functions in their
// configurations (persistence.PipelineConfig.OnCommit, actors.Hooks,
// gateway.Config.Metrics, cluster gauges) and never import it.
//
// Labels are bounded: behaviour, route pattern, status class, event names.
// Never an object key, a slot name or a secret.
package metrics

import (
	"context"
	"net/http"
	"runtime"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/holdfast/holdfast/cold"
)

// Metrics holds a node's collectors.
type Metrics struct {
	reg *prometheus.Registry

	commitWrites prometheus.Histogram
	syncSeconds  prometheus.Histogram

	requests *prometheus.CounterVec
	latency  *prometheus.HistogramVec

	passivated prometheus.Counter
	alarmLate  prometheus.Histogram
	queue      *prometheus.CounterVec

	coldBytes   *prometheus.CounterVec
	coldErrors  *prometheus.CounterVec
	coldSeconds *prometheus.HistogramVec

	dropped  prometheus.Counter
	handoffs *prometheus.CounterVec
}

// New returns the metrics of one node, with Go's runtime and process
// collectors.
func New() *Metrics {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	f := func(c prometheus.Collector) { reg.MustRegister(c) }
	m := &Metrics{reg: reg}
	m.commitWrites = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name: "holdfast_commit_batch_writes", Help: "Writes covered by one commit (one sync).",
		Buckets: prometheus.ExponentialBuckets(1, 2, 12),
	})
	m.syncSeconds = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name: "holdfast_sync_seconds", Help: "Time of one commit's write and sync of the write-ahead log.",
		Buckets: prometheus.ExponentialBuckets(0.0001, 2, 16),
	})
	m.requests = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "holdfast_http_requests_total", Help: "HTTP requests by behaviour, method, route (the path pattern) and status code.",
	}, []string{"behaviour", "method", "route", "code"})
	m.latency = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name: "holdfast_http_request_seconds", Help: "HTTP request latency by behaviour, method and route (the path pattern).",
		Buckets: prometheus.ExponentialBuckets(0.0001, 2, 18),
	}, []string{"behaviour", "method", "route"})
	m.passivated = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "holdfast_objects_passivated_total", Help: "Object activations passivated after being idle.",
	})
	m.alarmLate = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name: "holdfast_alarm_lateness_seconds", Help: "How long after its time an alarm ran.",
		Buckets: prometheus.ExponentialBuckets(0.001, 2, 16),
	})
	m.queue = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "holdfast_queue_messages_total",
		Help: "Queue message transitions: enqueued, delivered (to processing), completed, dead_lettered.",
	}, []string{"event"})
	m.coldBytes = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "holdfast_cold_bytes_total", Help: "Bytes written to (flush) and read from (read) the cold store.",
	}, []string{"op"})
	m.coldErrors = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "holdfast_cold_errors_total", Help: "Failed cold store calls.",
	}, []string{"op"})
	m.coldSeconds = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name: "holdfast_cold_seconds", Help: "Cold store call latency.", Buckets: prometheus.ExponentialBuckets(0.001, 2, 14),
	}, []string{"op"})
	m.dropped = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "holdfast_websocket_slow_closed_total", Help: "Websockets closed because their outgoing buffer overflowed.",
	})
	m.handoffs = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "holdfast_cluster_handoffs_total", Help: "Partition handoffs this node started, by result.",
	}, []string{"result"})
	for _, c := range []prometheus.Collector{m.commitWrites, m.syncSeconds, m.requests, m.latency, m.passivated, m.alarmLate,
		m.queue, m.coldBytes, m.coldErrors, m.coldSeconds, m.dropped, m.handoffs} {
		f(c)
	}
	// Known label values start at zero, so the series exist from the start.
	for _, ev := range []string{"enqueued", "delivered", "completed", "dead_lettered"} {
		m.queue.WithLabelValues(ev)
	}
	for _, op := range []string{"flush", "read"} {
		m.coldBytes.WithLabelValues(op)
		m.coldErrors.WithLabelValues(op)
		m.coldSeconds.WithLabelValues(op)
	}
	for _, r := range []string{"ok", "failed"} {
		m.handoffs.WithLabelValues(r)
	}
	return m
}

// BuildInfo registers holdfast_build_info, always 1, whose labels say what
// runs: the version, the VCS revision ("" when unknown) and Go's version.
// Dashboards join on it (Prometheus's convention for *_build_info).
func (m *Metrics) BuildInfo(version, revision string) {
	g := prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "holdfast_build_info", Help: "Always 1; the labels say which build of Holdfast runs.",
		ConstLabels: prometheus.Labels{"version": version, "revision": revision, "goversion": runtime.Version()},
	})
	g.Set(1)
	m.reg.MustRegister(g)
}

// Handler serves the metrics in the Prometheus text format.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{Registry: m.reg})
}

// Registry is where callers register gauges that read their own state.
func (m *Metrics) Registry() *prometheus.Registry { return m.reg }

// GaugeFunc registers a gauge whose value f reads at scrape time.
func (m *Metrics) GaugeFunc(name, help string, f func() float64) {
	m.reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: name, Help: help}, f))
}

// CounterFunc registers a counter whose value f reads at scrape time.
func (m *Metrics) CounterFunc(name, help string, f func() float64) {
	m.reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Name: name, Help: help}, f))
}

// Commit observes one commit of the pipeline (persistence.PipelineConfig.OnCommit).
func (m *Metrics) Commit(writes int, sync time.Duration) {
	m.commitWrites.Observe(float64(writes))
	m.syncSeconds.Observe(sync.Seconds())
}

// Request observes one HTTP request: route is its path pattern, without the
// method.
func (m *Metrics) Request(behaviour, method, route string, code int, d time.Duration) {
	m.requests.WithLabelValues(behaviour, method, route, strconv.Itoa(code)).Inc()
	m.latency.WithLabelValues(behaviour, method, route).Observe(d.Seconds())
}

// Passivated counts one passivation.
func (m *Metrics) Passivated() { m.passivated.Inc() }

// AlarmRan observes an alarm that ran late by late.
func (m *Metrics) AlarmRan(late time.Duration) { m.alarmLate.Observe(max(late, 0).Seconds()) }

// Queue counts n queue transitions of event.
func (m *Metrics) Queue(event string, n int) { m.queue.WithLabelValues(event).Add(float64(n)) }

// SlowSocketClosed counts a websocket closed for falling behind.
func (m *Metrics) SlowSocketClosed() { m.dropped.Inc() }

// Handoff counts a partition handoff by result ("ok", "failed").
func (m *Metrics) Handoff(result string) { m.handoffs.WithLabelValues(result).Inc() }

// Cold wraps a cold store so that its calls are measured.
func (m *Metrics) Cold(s cold.Store) cold.Store {
	if s == nil {
		return nil
	}
	return &coldStore{Store: s, m: m}
}

type coldStore struct {
	cold.Store
	m *Metrics
}

func (c *coldStore) observe(op string, start time.Time, n int, err error) {
	c.m.coldSeconds.WithLabelValues(op).Observe(time.Since(start).Seconds())
	if err != nil {
		c.m.coldErrors.WithLabelValues(op).Inc()
		return
	}
	c.m.coldBytes.WithLabelValues(op).Add(float64(n))
}

func (c *coldStore) Create(ctx context.Context, key string, data []byte) error {
	start := time.Now()
	err := c.Store.Create(ctx, key, data)
	c.observe("flush", start, len(data), err)
	return err
}

func (c *coldStore) Get(ctx context.Context, key string) ([]byte, error) {
	start := time.Now()
	data, err := c.Store.Get(ctx, key)
	c.observe("read", start, len(data), err)
	return data, err
}

// QueueStates are the states of holdfast_queue_depth, in the order
// QueueDepth's function returns them.
var QueueStates = [4]string{"pending", "processing", "complete", "failed"}

// QueueDepth registers holdfast_queues and holdfast_queue_depth{state}, read
// by f once per scrape: the number of queues, and the pairs in each of
// QueueStates. When f fails, the scrape leaves both out and logs nothing
// here (f logs); holdfast_queue_depth_errors_total counts the failures.
func (m *Metrics) QueueDepth(f func() (queues int, states [4]int64, err error)) {
	c := &queueDepth{
		f:      f,
		queues: prometheus.NewDesc("holdfast_queues", "Queue objects in the partitions this node serves.", nil, nil),
		depth: prometheus.NewDesc("holdfast_queue_depth",
			"Queue (message, target) pairs by state over the partitions this node serves: pending (delayed included), processing, complete (not yet compacted), failed (dead letters).",
			[]string{"state"}, nil),
		errs: prometheus.NewCounter(prometheus.CounterOpts{Name: "holdfast_queue_depth_errors_total", Help: "Scrapes that could not read the queue depth."}),
	}
	m.reg.MustRegister(c, c.errs)
}

type queueDepth struct {
	f             func() (int, [4]int64, error)
	queues, depth *prometheus.Desc
	errs          prometheus.Counter
}

func (c *queueDepth) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.queues
	ch <- c.depth
}

func (c *queueDepth) Collect(ch chan<- prometheus.Metric) {
	n, states, err := c.f()
	if err != nil {
		c.errs.Inc()
		return
	}
	ch <- prometheus.MustNewConstMetric(c.queues, prometheus.GaugeValue, float64(n))
	for i, s := range QueueStates {
		ch <- prometheus.MustNewConstMetric(c.depth, prometheus.GaugeValue, float64(states[i]), s)
	}
}
