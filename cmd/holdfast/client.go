package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"sort"
	"strings"
	"time"

	"github.com/spf13/cobra"

	hfclient "github.com/holdfast/holdfast/client"
)

// The client commands (object, log, queue, alarm, token, export, import) talk
// to a running node over its REST API and websocket. They share one set of
// connection flags and one HTTP helper; every non-2xx reply becomes a
// *serverError carrying the server's message, which main prints before
// exiting 1.

const defaultURL = "http://127.0.0.1:7070"

// clientOpts are the connection flags every client command group has.
type clientOpts struct {
	url, appKey, appSecret string
	context                string // a saved context (context.go); "": HOLDFAST_CONTEXT, else the current one
	json                   bool
}

// clientGroup returns a command group with the connection flags as persistent
// flags. The env defaults are read when a command runs, so that --help never
// prints the secret.
func clientGroup(use, short string) (*cobra.Command, *clientOpts) {
	o := &clientOpts{}
	cmd := &cobra.Command{Use: use, Short: short, Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return cmd.Help() }}
	pf := cmd.PersistentFlags()
	pf.StringVar(&o.url, "url", "", "the node's base URL (default $HOLDFAST_URL, else "+defaultURL+")")
	pf.StringVar(&o.appKey, "app-key", "", "App Key (default $HOLDFAST_APP_KEY)")
	pf.StringVar(&o.appSecret, "app-secret", "", "App Secret (default $HOLDFAST_APP_SECRET)")
	pf.StringVar(&o.context, "context", "", "a saved context (holdfast context; default $HOLDFAST_CONTEXT, else the current one)")
	_ = cmd.RegisterFlagCompletionFunc("context", func(c *cobra.Command, args []string, prefix string) ([]string, cobra.ShellCompDirective) {
		return completeContexts(c, args, prefix)
	})
	pf.BoolVar(&o.json, "json", false, "print the server's JSON replies instead of text")
	return cmd, o
}

// clientCommands are the client command groups, for main.
func clientCommands() []*cobra.Command {
	return []*cobra.Command{objectCommand(), logCommand(), queueCommand(), alarmCommand(),
		tokenCommand(), exportCommand(), importCommand()}
}

// client sends requests to one node as one app, through the Go client
// library (package client).
type client struct {
	lib         *hfclient.Client
	base        *url.URL
	key, secret string
	http        *http.Client
}

// client builds the client the flags and environment describe.
func (o *clientOpts) client() (*client, error) {
	saved, _, err := chosenContext(firstNonEmpty(o.context, os.Getenv("HOLDFAST_CONTEXT")))
	if err != nil {
		return nil, err
	}
	u, err := parseBaseURL(firstNonEmpty(o.url, os.Getenv("HOLDFAST_URL"), saved.URL, defaultURL))
	if err != nil {
		return nil, err
	}
	c := &client{base: u, key: firstNonEmpty(o.appKey, os.Getenv("HOLDFAST_APP_KEY"), saved.AppKey),
		secret: firstNonEmpty(o.appSecret, os.Getenv("HOLDFAST_APP_SECRET"), saved.AppSecret),
		http:   &http.Client{Timeout: 2 * time.Minute}}
	if c.key == "" || c.secret == "" {
		return nil, errors.New("no app credentials: set HOLDFAST_APP_KEY and HOLDFAST_APP_SECRET, pass --app-key and --app-secret, or save a context (holdfast context add)")
	}
	if c.lib, err = hfclient.New(u.String(), c.key, c.secret, hfclient.WithHTTPClient(c.http)); err != nil {
		return nil, err
	}
	return c, nil
}

// parseBaseURL checks a node's base URL (--url, a context's).
func parseBaseURL(raw string) (*url.URL, error) {
	u, err := url.Parse(strings.TrimSuffix(raw, "/"))
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("--url %q: want http://host:port or https://host:port", raw)
	}
	return u, nil
}

func firstNonEmpty(s ...string) string {
	for _, v := range s {
		if v != "" {
			return v
		}
	}
	return ""
}

// serverError is a non-2xx reply: the server's message, code and request id
// (the client library's error).
type serverError = hfclient.Error

// decodeServerError reads an error reply of spec/errors.md.
func decodeServerError(status int, header http.Header, body []byte) *serverError {
	return hfclient.NewError(status, header, body)
}

// do sends one request and returns the reply's status and body. body is sent
// as JSON (json.RawMessage as is; nil sends nothing). A non-2xx reply is a
// *serverError.
func (c *client) do(ctx context.Context, method, path string, query url.Values, body any) (int, []byte, error) {
	var raw json.RawMessage
	status, err := c.lib.Do(ctx, method, path, query, nil, body, &raw)
	var se *serverError
	if err != nil && !errors.As(err, &se) {
		return status, nil, fmt.Errorf("%s %s: %w", method, c.base.Redacted(), unwrapURLError(err))
	}
	return status, raw, err
}

// call is do that decodes a JSON reply into out (unless out is nil).
func (c *client) call(ctx context.Context, method, path string, query url.Values, body, out any) ([]byte, error) {
	_, b, err := c.do(ctx, method, path, query, body)
	if err != nil {
		return nil, err
	}
	if out != nil && len(bytes.TrimSpace(b)) > 0 {
		if err := json.Unmarshal(b, out); err != nil {
			return nil, fmt.Errorf("the server's reply is not what was expected: %w", err)
		}
	}
	return b, nil
}

func unwrapURLError(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		return ue.Err
	}
	return err
}

// objectRef is an object's address: TYPE/KEY on the command line.
type objectRef struct{ typ, key string }

func parseObjectRef(s string) (objectRef, error) {
	typ, key, ok := strings.Cut(s, "/")
	if !ok || typ == "" || key == "" {
		return objectRef{}, fmt.Errorf("%q: name an object as TYPE/KEY, for example order/o42", s)
	}
	return objectRef{typ, key}, nil
}

// path is /api/v1/{kind}/{app}/{type}/{key} followed by the escaped segments.
func (c *client) path(kind string, o objectRef, segs ...string) string {
	p := "/api/v1/" + kind + "/" + url.PathEscape(c.key) + "/" + url.PathEscape(o.typ) + "/" + url.PathEscape(o.key)
	for _, s := range segs {
		p += "/" + url.PathEscape(s)
	}
	return p
}

// usageArgs checks the argument count and names the command's usage when it is
// wrong (cobra's own message names only the counts).
// hi < 0 means no upper bound.
func usageArgs(lo, hi int) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		if len(args) < lo || (hi >= 0 && len(args) > hi) {
			return fmt.Errorf("usage: %s (see --help)", cmd.UseLine())
		}
		return nil
	}
}

// parseJSONArg reads a command-line JSON value; what names it in the error.
func parseJSONArg(what, s string) (json.RawMessage, error) {
	if !json.Valid([]byte(s)) {
		return nil, fmt.Errorf("%s %q is not valid JSON (quote a string: '\"text\"')", what, s)
	}
	return json.RawMessage(s), nil
}

// printJSON writes a reply as one line of JSON (compacted).
func printJSON(w io.Writer, b []byte) error {
	var buf bytes.Buffer
	if err := json.Compact(&buf, b); err != nil {
		return err
	}
	buf.WriteByte('\n')
	_, err := w.Write(buf.Bytes())
	return err
}

// printValue writes v as compact JSON followed by a newline (marshals non-raw values).
func printValue(w io.Writer, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return printJSON(w, b)
}

// sortedKeys returns m's keys in order.
func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// msTime formats unix milliseconds for people.
func msTime(ms int64) string {
	return time.UnixMilli(ms).UTC().Format(time.RFC3339Nano)
}
