// Package client is a Go client of a Holdfast node's REST API (the routes of
// spec/objects.md, log.md, queue.md and batch.md) for services outside the
// cluster. It depends on nothing of the server: its types are the JSON the
// routes speak.
//
//	c, err := client.New("http://127.0.0.1:7070", appKey, appSecret)
//	o := c.Object("order", "o42")
//	r, err := o.Increment(ctx, "items", 2, client.IdempotencyKey("k1"))
//	results, err := c.Batch(ctx, client.IncrementOp("order/o42", "items", 1), client.GetOp("order/o43", ""))
//	feed := o.Watch(ctx) // the live feed: for ev := range feed.C { ... }; feed.Err()
//
// Every call takes a context; a reply that is not 2xx is an *Error with the
// server's message, code and request id (spec/errors.md). A Client is safe
// for concurrent use and keeps its connections alive (one http.Client).
package client

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// Client talks to one node (or a load balancer in front of a cluster) as one
// app.
type Client struct {
	base   *url.URL
	key    string
	secret string
	http   *http.Client
}

// Option configures a Client.
type Option func(*Client)

// WithHTTPClient makes the Client send its requests through hc (timeouts,
// transport, proxies). The default is an http.Client with a 2-minute timeout
// and keep-alive connections.
func WithHTTPClient(hc *http.Client) Option { return func(c *Client) { c.http = hc } }

// New returns a client of the node at baseURL (http or https, such as
// "http://127.0.0.1:7070") for the app with appKey and appSecret.
func New(baseURL, appKey, appSecret string, opts ...Option) (*Client, error) {
	u, err := url.Parse(strings.TrimSuffix(baseURL, "/"))
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("client: base URL %q: want http://host:port or https://host:port", baseURL)
	}
	if appKey == "" || appSecret == "" {
		return nil, errors.New("client: an app key and an app secret are needed")
	}
	c := &Client{base: u, key: appKey, secret: appSecret, http: &http.Client{Timeout: 2 * time.Minute}}
	for _, o := range opts {
		o(c)
	}
	return c, nil
}

// Error is a reply that is not 2xx (spec/errors.md).
type Error struct {
	Status    int    // the HTTP status
	Code      string // "not_found", "invalid", "conflict", "unavailable", ...
	Message   string
	RequestID string
	// RetryAfter is the server's retryAfterMs on 429 and 503 (0: none).
	RetryAfter time.Duration
	// Body is the whole error body, for the fields of particular errors
	// (such as oldest_log_id of a 410).
	Body map[string]any
}

func (e *Error) Error() string {
	var b strings.Builder
	b.WriteString(e.Message)
	fmt.Fprintf(&b, " (HTTP %d", e.Status)
	if e.Code != "" {
		b.WriteString(", " + e.Code)
	}
	if e.RequestID != "" {
		b.WriteString(", request_id " + e.RequestID)
	}
	b.WriteString(")")
	return b.String()
}

// IsNotFound reports whether err is a 404 of the server.
func IsNotFound(err error) bool {
	var e *Error
	return errors.As(err, &e) && e.Status == http.StatusNotFound
}

// Retryable reports whether err is a refusal the server asks to retry (429 or
// 503 with retryAfterMs) and how long it asks to wait.
func Retryable(err error) (time.Duration, bool) {
	var e *Error
	if errors.As(err, &e) && (e.Status == http.StatusTooManyRequests || e.Status == http.StatusServiceUnavailable) {
		return e.RetryAfter, true
	}
	return 0, false
}

// NewError is the *Error of a reply that is not 2xx, for a caller that sent
// its own request (a websocket upgrade): its status, header and body.
func NewError(status int, header http.Header, body []byte) *Error {
	return decodeError(status, header, body)
}

// decodeError reads an error body: {"error", "code", "request_id", ...}, or
// the 401 shape {"errors": [{"title"}]}.
func decodeError(status int, header http.Header, body []byte) *Error {
	e := &Error{Status: status, RequestID: header.Get("X-Request-Id")}
	d := json.NewDecoder(bytes.NewReader(body))
	d.UseNumber()
	_ = d.Decode(&e.Body)
	if m, ok := e.Body["error"].(string); ok {
		e.Message = m
	}
	if c, ok := e.Body["code"].(string); ok {
		e.Code = c
	}
	if id, ok := e.Body["request_id"].(string); ok && id != "" {
		e.RequestID = id
	}
	if ms, ok := e.Body["retryAfterMs"].(json.Number); ok {
		if n, err := ms.Int64(); err == nil {
			e.RetryAfter = time.Duration(n) * time.Millisecond
		}
	}
	switch {
	case e.Message == "" && status == http.StatusUnauthorized:
		e.Message = "unauthorized: check the app key and secret"
	case e.Message == "":
		if e.Message = strings.TrimSpace(string(body)); e.Message == "" {
			e.Message = http.StatusText(status)
		}
	}
	return e
}

// Do sends one request to path (below the base URL, already escaped) with
// body as JSON (json.RawMessage or []byte as is; nil sends none) and header
// added, and decodes a 2xx reply's body into out (when not nil). It returns
// the reply's status. A reply that is not 2xx is an *Error. The typed methods
// are built on it; it reaches any route they do not cover.
func (c *Client) Do(ctx context.Context, method, path string, query url.Values, header http.Header, body, out any) (int, error) {
	u := *c.base
	u.RawPath = c.base.EscapedPath() + path
	u.Path, _ = url.PathUnescape(u.RawPath)
	u.RawQuery = query.Encode()
	var rd io.Reader
	if body != nil {
		var b []byte
		switch v := body.(type) {
		case json.RawMessage:
			b = v
		case []byte:
			b = v
		default:
			var err error
			if b, err = json.Marshal(body); err != nil {
				return 0, fmt.Errorf("client: encode the request: %w", err)
			}
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, u.String(), rd)
	if err != nil {
		return 0, err
	}
	for k, v := range header {
		req.Header[k] = v
	}
	req.Header.Set("X-App-Key", c.key)
	req.Header.Set("X-App-Secret", c.secret)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return resp.StatusCode, fmt.Errorf("client: read the reply to %s %s: %w", method, path, err)
	}
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return resp.StatusCode, decodeError(resp.StatusCode, resp.Header, b)
	}
	if out != nil && len(bytes.TrimSpace(b)) > 0 {
		if err := json.Unmarshal(b, out); err != nil {
			return resp.StatusCode, fmt.Errorf("client: the reply to %s %s is not what was expected: %w", method, path, err)
		}
	}
	return resp.StatusCode, nil
}

// path is /api/v1/{kind}/{app}/{type}/{key} and the escaped segments.
func (c *Client) path(kind, typ, key string, segs ...string) string {
	p := "/api/v1/" + kind + "/" + url.PathEscape(c.key) + "/" + url.PathEscape(typ) + "/" + url.PathEscape(key)
	for _, s := range segs {
		p += "/" + url.PathEscape(s)
	}
	return p
}

// value encodes v as a JSON value: json.RawMessage and []byte as they are
// (they must be JSON), anything else through encoding/json.
func value(v any) (json.RawMessage, error) {
	switch x := v.(type) {
	case json.RawMessage:
		return x, nil
	case []byte:
		return x, nil
	}
	b, err := json.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("client: encode a value: %w", err)
	}
	return b, nil
}

func itoa(n uint64) string { return strconv.FormatUint(n, 10) }
