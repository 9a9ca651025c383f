package client

import (
	"context"
	"iter"
	"net/http"
	"net/url"
	"strconv"
)

// ListKind names a listing: the objects of a type that hold any state, the
// ones that hold a log, or a queue (spec/batch.md, "the keys of a type").
type ListKind string

const (
	ListObjects ListKind = "objects"
	ListLogs    ListKind = "logs"
	ListQueues  ListKind = "queues"
)

// ListOptions narrow a listing: keys that start with Prefix and sort after
// After (byte order), at most Limit per page (0: the server's default, 100;
// at most 1,000).
type ListOptions struct {
	Prefix, After string
	Limit         int
}

// KeyPage is a page of keys in byte order; Next, when not empty, is the
// After of the next page.
type KeyPage struct {
	Keys []string `json:"keys"`
	Next string   `json:"next,omitempty"`
}

// List returns one page of the keys of type typ's objects of the kind, from
// every partition (and every node of a cluster).
func (c *Client) List(ctx context.Context, kind ListKind, typ string, opts ListOptions) (*KeyPage, error) {
	var page KeyPage
	if _, err := c.Do(ctx, http.MethodGet, "/api/v1/"+string(kind)+"/"+url.PathEscape(c.key)+"/"+url.PathEscape(typ), listQuery(opts), nil, nil, &page); err != nil {
		return nil, err
	}
	return &page, nil
}

// Keys pages through every key of the listing (from opts.After), yielding
// each in byte order; it stops at the first error, which it yields.
func (c *Client) Keys(ctx context.Context, kind ListKind, typ string, opts ListOptions) iter.Seq2[string, error] {
	return func(yield func(string, error) bool) {
		for {
			page, err := c.List(ctx, kind, typ, opts)
			if err != nil {
				yield("", err)
				return
			}
			for _, k := range page.Keys {
				if !yield(k, nil) {
					return
				}
			}
			if page.Next == "" {
				return
			}
			opts.After = page.Next
		}
	}
}

// TypePage is a page of an app's types in byte order; Next, when not empty,
// is the After of the next page.
type TypePage struct {
	Types []string `json:"types"`
	Next  string   `json:"next,omitempty"`
}

// Types returns one page of the app's types that have objects holding any
// stored data (GET /api/v1/objects/{app}).
func (c *Client) Types(ctx context.Context, opts ListOptions) (*TypePage, error) {
	var page TypePage
	if _, err := c.Do(ctx, http.MethodGet, "/api/v1/objects/"+url.PathEscape(c.key), listQuery(opts), nil, nil, &page); err != nil {
		return nil, err
	}
	return &page, nil
}

func listQuery(opts ListOptions) url.Values {
	q := url.Values{}
	if opts.Prefix != "" {
		q.Set("prefix", opts.Prefix)
	}
	if opts.After != "" {
		q.Set("after", opts.After)
	}
	if opts.Limit > 0 {
		q.Set("limit", strconv.Itoa(opts.Limit))
	}
	return q
}
