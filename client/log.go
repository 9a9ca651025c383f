package client

import (
	"context"
	"encoding/json"
	"net/http"
	"net/url"
)

// Log is a retained log's routes (spec/log.md).
type Log struct {
	c        *Client
	typ, key string
}

// Log returns the log of object (typ, key).
func (c *Client) Log(typ, key string) *Log { return &Log{c: c, typ: typ, key: key} }

// Record is a record to append: Body (any JSON value; a json.RawMessage is
// sent compacted, as encoding/json writes it) and an optional
// DeduplicationKey.
type Record struct {
	Body             any    `json:"body"`
	DeduplicationKey string `json:"deduplicationKey,omitempty"`
}

// LogRecord is a record read back, its body as appended.
type LogRecord struct {
	Offset           uint64          `json:"offset"`
	Body             json.RawMessage `json:"body"`
	DeduplicationKey string          `json:"deduplicationKey"`
	AppendedAt       int64           `json:"appendedAt"`
}

// RecordPage is a page of records and where the next one starts.
type RecordPage struct {
	Records    []LogRecord `json:"records"`
	NextOffset uint64      `json:"nextOffset"`
	Lag        uint64      `json:"lag"`
}

// Append appends records atomically and returns their offsets (a record
// whose deduplication key was seen gets the first one's offset).
func (l *Log) Append(ctx context.Context, records ...Record) ([]uint64, error) {
	if records == nil {
		records = []Record{}
	}
	var r struct {
		Offsets []uint64 `json:"offsets"`
	}
	if _, err := l.c.Do(ctx, http.MethodPost, l.c.path("logs", l.typ, l.key, "append"), nil, nil, map[string]any{"records": records}, &r); err != nil {
		return nil, err
	}
	return r.Offsets, nil
}

// Read reads up to limit records (0: the type's maximum batch) from offset
// from. An offset no longer held is an *Error with Status 410.
func (l *Log) Read(ctx context.Context, from uint64, limit int) (*RecordPage, error) {
	q := url.Values{"from": {itoa(from)}}
	if limit > 0 {
		q.Set("limit", itoa(uint64(limit)))
	}
	var p RecordPage
	if _, err := l.c.Do(ctx, http.MethodGet, l.c.path("logs", l.typ, l.key, "records"), q, nil, nil, &p); err != nil {
		return nil, err
	}
	return &p, nil
}
