package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"mime"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/santhosh-tekuri/jsonschema/v6"
	"gopkg.in/yaml.v3"

	"github.com/holdfast/holdfast/actors"
	"github.com/holdfast/holdfast/cluster"
	"github.com/holdfast/holdfast/metrics"
)

// docs/openapi.yaml describes every route of the gateway. These tests hold it
// to the server, so that the two cannot drift apart:
//
//   - TestOpenAPI_EveryRouteIsDocumentedAndEveryOperationServed: the routes the
//     server registers (Server.patterns) and the document's operations are the
//     same set, and the operations' security matches their 401s.
//   - TestOpenAPI_RepliesMatchTheDocument: a tour calls every operation on a
//     real node (and the failures a node shows only under load or when broken,
//     on a stub node); every reply's status must be documented for the
//     operation the request matched, its required headers present, its media
//     type documented, and its JSON body valid against the documented schema,
//     whose required members and additionalProperties: false catch a field
//     missing from a reply or a field the document lacks.

// openAPIFile is the document, relative to this package.
const openAPIFile = "../docs/openapi.yaml"

// openAPIURL is the document's URL in the schema compiler: its $refs
// ("#/components/...") resolve against it.
const openAPIURL = "file:///openapi.json"

// openAPIMethods are the HTTP methods an OpenAPI path item may hold.
var openAPIMethods = []string{"get", "put", "post", "delete", "options", "head", "patch", "trace"}

// openAPI is the loaded document.
type openAPI struct {
	doc      map[string]any // JSON values (numbers as json.Number)
	compiler *jsonschema.Compiler
	schemas  map[string]*jsonschema.Schema // compiled, by JSON pointer
}

func loadOpenAPI(t *testing.T) *openAPI {
	t.Helper()
	src, err := os.ReadFile(openAPIFile)
	if err != nil {
		t.Fatal(err)
	}
	var y any
	if err := yaml.Unmarshal(src, &y); err != nil {
		t.Fatalf("%s: %v", openAPIFile, err)
	}
	v, err := jsonCompatible(y, "")
	if err != nil {
		t.Fatalf("%s: %v", openAPIFile, err)
	}
	// Through JSON text, so that the values are exactly what a JSON tool
	// reading the document would see.
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatalf("%s: %v", openAPIFile, err)
	}
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	c := jsonschema.NewCompiler()
	c.DefaultDraft(jsonschema.Draft2020) // OpenAPI 3.1's schemas are JSON Schema 2020-12
	if err := c.AddResource(openAPIURL, doc); err != nil {
		t.Fatal(err)
	}
	d := &openAPI{doc: doc.(map[string]any), compiler: c, schemas: map[string]*jsonschema.Schema{}}
	if got := d.doc["openapi"]; got != "3.1.0" {
		t.Fatalf("openapi is %v, want 3.1.0", got)
	}
	return d
}

// jsonCompatible turns a decoded YAML value into JSON values. A mapping key
// that is not a string (an unquoted status code) is refused: JSON tools would
// not read the document the same way.
func jsonCompatible(v any, at string) (any, error) {
	switch v := v.(type) {
	case map[string]any:
		out := make(map[string]any, len(v))
		for k, e := range v {
			c, err := jsonCompatible(e, at+"/"+k)
			if err != nil {
				return nil, err
			}
			out[k] = c
		}
		return out, nil
	case map[any]any:
		out := make(map[string]any, len(v))
		for k, e := range v {
			s, ok := k.(string)
			if !ok {
				return nil, fmt.Errorf("%s: key %v is a %T, not a string: quote it", at, k, k)
			}
			c, err := jsonCompatible(e, at+"/"+s)
			if err != nil {
				return nil, err
			}
			out[s] = c
		}
		return out, nil
	case []any:
		out := make([]any, len(v))
		for i, e := range v {
			c, err := jsonCompatible(e, at+"/"+strconv.Itoa(i))
			if err != nil {
				return nil, err
			}
			out[i] = c
		}
		return out, nil
	}
	return v, nil
}

// pointer is the JSON pointer of tokens (RFC 6901).
func pointer(tokens ...string) string {
	var b strings.Builder
	for _, tok := range tokens {
		b.WriteByte('/')
		b.WriteString(strings.NewReplacer("~", "~0", "/", "~1").Replace(tok))
	}
	return b.String()
}

// at returns the value at JSON pointer ptr of the document.
func (d *openAPI) at(ptr string) (any, bool) {
	var v any = d.doc
	if ptr == "" {
		return v, true
	}
	for _, tok := range strings.Split(strings.TrimPrefix(ptr, "/"), "/") {
		tok = strings.NewReplacer("~1", "/", "~0", "~").Replace(tok)
		switch c := v.(type) {
		case map[string]any:
			var ok bool
			if v, ok = c[tok]; !ok {
				return nil, false
			}
		case []any:
			i, err := strconv.Atoi(tok)
			if err != nil || i < 0 || i >= len(c) {
				return nil, false
			}
			v = c[i]
		default:
			return nil, false
		}
	}
	return v, true
}

// object returns the object at ptr, following a local $ref (a response, a
// parameter, a header may be one), and the pointer it was found at.
func (d *openAPI) object(ptr string) (map[string]any, string, bool) {
	for range 8 {
		v, ok := d.at(ptr)
		m, isObj := v.(map[string]any)
		if !ok || !isObj {
			return nil, "", false
		}
		ref, isRef := m["$ref"].(string)
		if !isRef {
			return m, ptr, true
		}
		ptr, ok = strings.CutPrefix(ref, "#")
		if !ok {
			return nil, "", false
		}
	}
	return nil, "", false
}

// schema compiles the schema at JSON pointer ptr of the document.
func (d *openAPI) schema(ptr string) (*jsonschema.Schema, error) {
	if s, ok := d.schemas[ptr]; ok {
		return s, nil
	}
	// The fragment is a JSON pointer, percent-encoded as a URL's (the
	// compiler decodes it): "{app}" is "%7Bapp%7D".
	toks := strings.Split(ptr, "/")
	for i := range toks {
		toks[i] = url.PathEscape(toks[i])
	}
	s, err := d.compiler.Compile(openAPIURL + "#" + strings.Join(toks, "/"))
	if err != nil {
		return nil, err
	}
	d.schemas[ptr] = s
	return s, nil
}

// operations returns the document's operations as "METHOD /path".
func (d *openAPI) operations() []string {
	var ops []string
	paths, _ := d.doc["paths"].(map[string]any)
	for p, item := range paths {
		item, _ := item.(map[string]any)
		for _, m := range openAPIMethods {
			if _, ok := item[m]; ok {
				ops = append(ops, strings.ToUpper(m)+" "+p)
			}
		}
	}
	sort.Strings(ops)
	return ops
}

// operation returns the operation "METHOD /path" and its pointer.
func (d *openAPI) operation(op string) (map[string]any, string, bool) {
	method, path, _ := strings.Cut(op, " ")
	return d.object(pointer("paths", path, strings.ToLower(method)))
}

// templates returns the document's paths that match the request path p:
// same segments, each literal equal, each {param} any non-empty segment.
func (d *openAPI) templates(p string) []string {
	var out []string
	segs := strings.Split(p, "/")
	paths, _ := d.doc["paths"].(map[string]any)
	for tmpl := range paths {
		ts := strings.Split(tmpl, "/")
		if len(ts) != len(segs) {
			continue
		}
		match := true
		for i, s := range ts {
			if isParam := strings.HasPrefix(s, "{") && strings.HasSuffix(s, "}"); isParam && segs[i] == "" || !isParam && s != segs[i] {
				match = false
				break
			}
		}
		if match {
			out = append(out, tmpl)
		}
	}
	sort.Strings(out)
	return out
}

// routeOf folds a mux pattern into the document's "METHOD /path": the
// variant with a trailing slash ("/{$}") is the same operation. Go's {name}
// wildcards are OpenAPI's path parameters as they are.
func routeOf(pattern string) string { return strings.TrimSuffix(pattern, "/{$}") }

// checkReply holds reply r to the response the document gives operation op
// (or, with op "", to responseAt, a response of no operation) for its status:
// the status is documented (a "default" does not count), the headers the
// response marks required are there, a body has a documented media type, and
// a JSON body validates against its schema.
func (d *openAPI) checkReply(op, responseAt string, r reply) error {
	what := responseAt
	if op != "" {
		what = op + " " + strconv.Itoa(r.status)
		o, ptr, ok := d.operation(op)
		if !ok {
			return fmt.Errorf("%s is not a documented operation", op)
		}
		resp, _ := o["responses"].(map[string]any)
		if _, ok := resp[strconv.Itoa(r.status)]; !ok {
			return fmt.Errorf("%s: status %d is not documented (documented: %v)", op, r.status, keys(resp))
		}
		responseAt = ptr + pointer("responses", strconv.Itoa(r.status))
	}
	resp, ptr, ok := d.object(responseAt)
	if !ok {
		return fmt.Errorf("%s: no response at %s", what, responseAt)
	}
	headers, _ := resp["headers"].(map[string]any)
	for name := range headers {
		h, _, ok := d.object(ptr + pointer("headers", name))
		if ok && h["required"] == true && r.header.Get(name) == "" {
			return fmt.Errorf("%s: header %s is required but missing", what, name)
		}
	}
	content, _ := resp["content"].(map[string]any)
	if len(r.body) == 0 {
		if len(content) > 0 {
			return fmt.Errorf("%s: the reply has no body, the document gives it %v", what, keys(content))
		}
		return nil
	}
	ct := r.header.Get("Content-Type")
	mt, _, err := mime.ParseMediaType(ct)
	if err != nil {
		return fmt.Errorf("%s: Content-Type %q: %v", what, ct, err)
	}
	if _, ok := content[mt]; !ok {
		return fmt.Errorf("%s: media type %s is not documented (documented: %v)", what, mt, keys(content))
	}
	if mt != "application/json" {
		return nil
	}
	body, err := jsonschema.UnmarshalJSON(bytes.NewReader(r.body))
	if err != nil {
		return fmt.Errorf("%s: the body is not JSON: %v", what, err)
	}
	s, err := d.schema(ptr + pointer("content", mt, "schema"))
	if err != nil {
		return fmt.Errorf("%s: compile the schema: %v", what, err)
	}
	if err := s.Validate(body); err != nil {
		return fmt.Errorf("%s: the body does not match the schema: %s", what, schemaError(err))
	}
	return nil
}

// schemaError is a validation error on one line: where each mismatch is in
// the body (a JSON pointer) and what it is.
func schemaError(err error) string {
	var ve *jsonschema.ValidationError
	if !errors.As(err, &ve) {
		return err.Error()
	}
	var causes []string
	var walk func(e *jsonschema.ValidationError)
	walk = func(e *jsonschema.ValidationError) {
		if len(e.Causes) == 0 {
			causes = append(causes, e.Error()) // "at '/pointer': what"
		}
		for _, c := range e.Causes {
			walk(c)
		}
	}
	walk(ve)
	return strings.Join(causes, "; ")
}

// checkRequestBody holds a request body (maybe empty) that the server
// accepted to the operation's requestBody: its schema, and whether a body is
// required.
func (d *openAPI) checkRequestBody(op string, body string) error {
	o, ptr, _ := d.operation(op)
	_, documented := o["requestBody"]
	empty := strings.TrimSpace(body) == ""
	switch {
	case !documented && empty:
		return nil
	case !documented:
		return fmt.Errorf("%s: the server took a body the document does not describe", op)
	case empty:
		if rb, _, _ := d.object(ptr + "/requestBody"); rb["required"] == true {
			return fmt.Errorf("%s: the server took an empty body, the document requires one", op)
		}
		return nil
	}
	v, err := jsonschema.UnmarshalJSON(strings.NewReader(body))
	if err != nil {
		return fmt.Errorf("%s: the request body is not JSON: %v", op, err)
	}
	s, err := d.schema(ptr + pointer("requestBody", "content", "application/json", "schema"))
	if err != nil {
		return fmt.Errorf("%s: compile the request schema: %v", op, err)
	}
	if err := s.Validate(v); err != nil {
		return fmt.Errorf("%s: the request body the server took does not match the schema: %s", op, schemaError(err))
	}
	return nil
}

func keys(m map[string]any) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// TestOpenAPI_EveryRouteIsDocumentedAndEveryOperationServed: the server's
// routes and the document's operations are one set, a route also served with
// a trailing slash says so, and an operation documents 401 exactly when it
// needs the app's credentials.
func TestOpenAPI_EveryRouteIsDocumentedAndEveryOperationServed(t *testing.T) {
	d := loadOpenAPI(t)
	// Every optional route on: /metrics is served when a metrics handler is.
	s := New(Config{Node: &stubNode{}, Apps: NewApps([]App{testApp}), MetricsHandler: http.NotFoundHandler()})
	defer s.Close()

	served := map[string]bool{}
	slashed := map[string]bool{}
	for _, p := range s.patterns {
		served[routeOf(p)] = true
		if routeOf(p) != p {
			slashed[routeOf(p)] = true
		}
	}
	documented := map[string]bool{}
	for _, op := range d.operations() {
		documented[op] = true
	}
	for _, r := range slices.Sorted(maps.Keys(served)) {
		if !documented[r] {
			t.Errorf("route %s is served but not documented", r)
		}
	}
	for _, op := range slices.Sorted(maps.Keys(documented)) {
		if !served[op] {
			t.Errorf("operation %s is documented but not served", op)
		}
	}
	for r := range slashed {
		if o, _, ok := d.operation(r); ok && !strings.Contains(fmt.Sprint(o["description"]), "trailing slash") {
			t.Errorf("%s is also served with a trailing slash; its description does not say so", r)
		}
	}

	// Every $ref resolves, and every {param} of a path is a documented path
	// parameter (of the path item or of each of its operations).
	var refs func(v any, at string)
	refs = func(v any, at string) {
		switch v := v.(type) {
		case map[string]any:
			for k, e := range v {
				if ref, ok := e.(string); k == "$ref" && ok {
					if _, found := d.at(strings.TrimPrefix(ref, "#")); !strings.HasPrefix(ref, "#/") || !found {
						t.Errorf("%s: $ref %s does not resolve", at, ref)
					}
				}
				refs(e, at+pointer(k))
			}
		case []any:
			for i, e := range v {
				refs(e, at+pointer(strconv.Itoa(i)))
			}
		}
	}
	refs(d.doc, "")
	for _, op := range d.operations() {
		method, path, _ := strings.Cut(op, " ")
		declared := map[string]bool{}
		for _, at := range []string{pointer("paths", path, "parameters"), pointer("paths", path, strings.ToLower(method), "parameters")} {
			v, _ := d.at(at)
			list, _ := v.([]any)
			for i := range list {
				if p, _, ok := d.object(at + pointer(strconv.Itoa(i))); ok && p["in"] == "path" {
					declared[p["name"].(string)] = true
				}
			}
		}
		for _, seg := range strings.Split(path, "/") {
			if name, ok := strings.CutPrefix(seg, "{"); ok && !declared[strings.TrimSuffix(name, "}")] {
				t.Errorf("%s: path parameter %s is not declared", op, seg)
			}
		}
	}

	ids := map[string]string{}
	for _, op := range d.operations() {
		o, _, _ := d.operation(op)
		for _, field := range []string{"operationId", "summary", "description", "tags", "responses"} {
			if o[field] == nil {
				t.Errorf("%s has no %s", op, field)
			}
		}
		if id, _ := o["operationId"].(string); ids[id] != "" {
			t.Errorf("%s and %s share operationId %q", ids[id], op, id)
		} else {
			ids[id] = op
		}
		sec, own := o["security"].([]any)
		open := own && len(sec) == 0
		resp, _ := o["responses"].(map[string]any)
		if _, has401 := resp["401"]; has401 == open {
			t.Errorf("%s: needs credentials %v, documents 401 %v", op, !open, has401)
		}
		if _, ok := resp["default"]; ok {
			t.Errorf("%s documents a default response: list the statuses", op)
		}
		if ex := d.example(op); ex != "" {
			if err := d.checkRequestBody(op, ex); err != nil {
				t.Errorf("%s: its example: %v", op, err)
			}
		}
	}
}

// tourStep is one request of a tour and the status it must get. Its path and
// body may name values an earlier step saved, as {{name}}.
type tourStep struct {
	method string
	path   string
	body   string
	// hdr is the request's headers: nil sends testApp's credentials.
	hdr  map[string]string
	want int
	// save names values of the JSON reply to use in later steps: name to a
	// dotted path ("messages.0.receipt").
	save map[string]string
}

// noAuth sends no credentials.
var noAuth = map[string]string{}

// withAuth is testApp's credentials and the headers kv (name, value, ...).
func withAuth(kv ...string) map[string]string {
	h := map[string]string{"X-App-Key": testApp.Key, "X-App-Secret": testApp.Secret}
	for i := 0; i+1 < len(kv); i += 2 {
		h[kv[i]] = kv[i+1]
	}
	return h
}

// tourOptions are the types of the tour's node: "events" has a log with
// leases (one range at a time, dead-lettered after one attempt) and keeps 3
// records; "jobs" has a queue whose messages are dead-lettered at their
// first failure.
func tourOptions(typ string) actors.TypeOptions {
	o := actors.DefaultTypeOptions()
	switch typ {
	case "events":
		o.Log = actors.LogOptions{MaxBatchSize: 3, MaxRecords: 3,
			Leases: &actors.LeaseOptions{MaxParallelism: 1, LeaseDuration: time.Minute, MaxAttempts: 1}}
	case "jobs":
		o.Queue = actors.QueueOptions{MaxAttempts: 1}
	}
	return o
}

// nodeTour calls every operation on a real node, successes and the errors a
// client meets, in an order whose state each step relies on.
func nodeTour() []tourStep {
	const (
		o     = "/api/v1/objects/app_test/order/o1"
		l     = "/api/v1/logs/app_test/events/p1"
		plain = "/api/v1/logs/app_test/plain/p1" // a log without leases
		a     = "/api/v1/alarms/app_test/order/o1"
		q     = "/api/v1/queues/app_test/jobs/q1"
		never = `"at":253402300799999` // the latest alarm time
	)
	tooBig := `{"value":"` + strings.Repeat("x", MaxBodyBytes) + `"}`
	return []tourStep{
		// The node.
		{method: "GET", path: "/healthz", hdr: noAuth, want: 200},
		{method: "GET", path: "/readyz", hdr: noAuth, want: 200},
		{method: "GET", path: "/metrics", hdr: noAuth, want: 200},
		{method: "POST", path: "/healthz", hdr: noAuth, want: 405},
		{method: "GET", path: "/api/v1/nothing", want: 404},
		{method: "GET", path: "/api/v1/objects/app_test/order/a/.", want: 400},

		// KV objects.
		{method: "GET", path: o, want: 200},
		{method: "GET", path: o, hdr: noAuth, want: 401},
		{method: "GET", path: o, hdr: map[string]string{"X-App-Key": testApp.Key, "X-App-Secret": "wrong"}, want: 401},
		{method: "GET", path: "/api/v1/objects/app_other/order/o1", want: 401},
		{method: "GET", path: "/api/v1/objects/app_test/bad:type/o1", want: 400},
		{method: "PUT", path: o + "/status", body: `{"value":"new"}`, want: 200},
		{method: "PUT", path: o + "/status", body: `{"value":"new"}`, hdr: withAuth("Idempotency-Key", ""), want: 400},
		{method: "PUT", path: o + "/status", body: `{"value":null}`, want: 422},
		{method: "PUT", path: o + "/log", body: `{"value":1}`, want: 422},
		{method: "PUT", path: o + "/status", body: `nope`, want: 400},
		{method: "PUT", path: o + "/status", body: tooBig, want: 413},
		{method: "POST", path: o + "/n/increment", body: `{"by":2}`, hdr: withAuth("Idempotency-Key", "k1"), want: 200},
		{method: "POST", path: o + "/n/increment", body: `{"by":2}`, hdr: withAuth("Idempotency-Key", "k1"), want: 200},
		{method: "POST", path: o + "/n/increment", body: `{"by":3}`, hdr: withAuth("Idempotency-Key", "k1"), want: 422},
		{method: "POST", path: o + "/n/increment", want: 200},
		{method: "POST", path: o + "/n/increment", body: `{"by":"1"}`, want: 400},
		{method: "POST", path: o + "/items/append", body: `{"value":{"sku":"A1"}}`, want: 200},
		{method: "POST", path: o + "/n/append", body: `{"value":1}`, want: 422},
		{method: "PATCH", path: o, body: `{"a":1,"b":[true],"status":null}`, hdr: withAuth("Idempotency-Key", "p1"), want: 200},
		{method: "PATCH", path: o + "/", body: `{}`, want: 200},
		{method: "PATCH", path: o, body: `[1]`, want: 400},
		{method: "GET", path: o + "/", want: 200},
		{method: "GET", path: o + "/n", want: 200},
		{method: "GET", path: o + "/missing", want: 404},
		{method: "DELETE", path: o + "/a", hdr: withAuth("Idempotency-Key", "d1"), want: 200},
		{method: "POST", path: o + "/transaction", body: `[{"op":"set","key":"t","value":true},{"op":"increment","key":"n","by":1.5},{"op":"delete","key":"b"}]`, want: 200},
		{method: "POST", path: o + "/transaction", body: `[]`, want: 422},
		{method: "POST", path: o + "/transaction", body: `{}`, want: 400},
		{method: "GET", path: o + "/log?after=0&limit=100", want: 200},
		{method: "GET", path: o + "/log?after=x", want: 400},
		{method: "POST", path: o + "/events", body: `{"event":"run:ping","payload":{"n":1}}`, want: 202},
		{method: "POST", path: o + "/events", body: `{"event":"ping"}`, want: 422},
		{method: "POST", path: o + "/events", body: `{"payload":1}`, want: 400},
		{method: "GET", path: "/api/v1/objects/app_test/order?prefix=o&limit=10", want: 200},
		{method: "GET", path: "/api/v1/objects/app_test?limit=1", want: 200},
		{method: "GET", path: "/api/v1/objects/app_test?limit=0", want: 400},
		{method: "GET", path: "/api/v1/objects/pk_test/order?limit=0", want: 400},
		{method: "DELETE", path: o, hdr: withAuth("Idempotency-Key", "purge"), want: 204},
		{method: "DELETE", path: o + "/", want: 204},
		{method: "GET", path: o + "/log?after=0", want: 410},
		{method: "POST", path: o, want: 405},
		{method: "PUT", path: o + "/n/increment", want: 405},

		// The retained log.
		{method: "POST", path: l + "/append", body: `{"records":[{"body":{"n":1},"deduplicationKey":"a"},{"body":2},{"body":3,"deduplicationKey":null}]}`, want: 200},
		{method: "POST", path: l + "/append", body: `{"records":[]}`, want: 422},
		{method: "POST", path: l + "/append", body: `{"records":[{"body":1,"deduplicationKey":""}]}`, want: 422},
		{method: "POST", path: l + "/append", body: `{"records":[{}]}`, want: 400},
		{method: "POST", path: l + "/append", body: `{"records":[{"body":4},{"body":5}]}`, want: 200},
		{method: "GET", path: l + "/records?from=0&limit=2", want: 200},
		{method: "GET", path: l + "/records?limit=0", want: 400},
		{method: "GET", path: l + "/bounds", want: 200},
		{method: "POST", path: l + "/consumers/c/lease", body: `{"limit":2}`, want: 200, save: map[string]string{"batch": "batchId"}},
		{method: "POST", path: l + "/consumers/c/lease", want: 204},
		{method: "POST", path: l + "/consumers/c/lease", body: `{"limit":0}`, want: 400},
		{method: "GET", path: l + "/consumers/c/leases", want: 200},
		{method: "POST", path: l + "/consumers/c/nack", body: `{"batchId":"{{batch}}"}`, want: 200},
		// maxAttempts 1: the nacked range goes to the dead letters, the next one out.
		{method: "POST", path: l + "/consumers/c/lease", body: "", want: 200, save: map[string]string{"batch2": "batchId"}},
		{method: "POST", path: l + "/consumers/c/ack", body: `{"batchId":"{{batch2}}"}`, want: 200},
		{method: "POST", path: l + "/consumers/c/ack", body: `{"batchId":"{{batch2}}"}`, want: 409},
		{method: "POST", path: l + "/consumers/c/nack", body: `{}`, want: 400},
		{method: "GET", path: l + "/consumers/c/dead-letters", want: 200},
		{method: "POST", path: plain + "/consumers/c/lease", want: 409},
		{method: "GET", path: l + "/cursors", want: 200},
		{method: "GET", path: l + "/cursors/c", want: 200},
		{method: "GET", path: l + "/cursors/nobody", want: 404},
		{method: "PUT", path: l + "/cursors/d", body: `{"offset":1}`, want: 200},
		{method: "PUT", path: l + "/cursors/d", body: `{"offset":99}`, want: 422},
		{method: "PUT", path: l + "/cursors/d", body: `{"offset":-1}`, want: 400},
		{method: "GET", path: l + "/load", want: 200},
		{method: "POST", path: l + "/trim", want: 200},
		{method: "GET", path: l + "/records?from=0", want: 410},
		{method: "POST", path: l + "/forget-cold", body: `{"before":1}`, want: 200},
		{method: "POST", path: l + "/forget-cold", body: `{}`, want: 400},
		{method: "GET", path: "/api/v1/logs/app_test/events", want: 200},
		{method: "GET", path: l + "/trim", want: 405},

		// Alarms.
		{method: "PUT", path: a + "/x", body: `{` + never + `,"action":{"kind":"trim"}}`, want: 200},
		{method: "PUT", path: a + "/y", body: `{` + never + `,"action":{"kind":"enqueue","topic":"t","payload":{"n":1}}}`, want: 200},
		{method: "PUT", path: a + "/z", body: `{` + never + `}`, want: 422},
		{method: "PUT", path: a + "/z", body: `{"at":"soon"}`, want: 400},
		{method: "GET", path: a + "/x", want: 200},
		{method: "GET", path: a + "?limit=1", want: 200},
		{method: "GET", path: a + "/", want: 200},
		{method: "GET", path: a + "?after=x", want: 400},
		{method: "DELETE", path: a + "/x", want: 204},
		{method: "DELETE", path: a + "/x", want: 404},
		{method: "GET", path: a + "/x", want: 404},
		{method: "POST", path: a + "/x", want: 405},

		// The write-ahead queue.
		{method: "POST", path: q + "/messages", body: `{"messages":[{"id":"m1","payload":{"n":1}},{"id":"m2","topic":"mail","payload":2},{"id":"m3","payload":3,"delayMs":60000}]}`, want: 200},
		{method: "POST", path: q + "/messages", body: `{"messages":[{"payload":1,"deliverAt":1,"delayMs":1}]}`, want: 400},
		{method: "POST", path: q + "/messages", body: `{"messages":[{"id":"","payload":1}]}`, want: 422},
		{method: "GET", path: q + "/messages/m1", want: 200},
		{method: "GET", path: q + "/messages/zz", want: 404},
		{method: "POST", path: q + "/receive", body: `{"max":1,"visibilityMs":60000}`, want: 200, save: map[string]string{"r1": "messages.0.receipt"}},
		{method: "POST", path: q + "/ack", body: `{"receipts":["{{r1}}"]}`, want: 200},
		{method: "POST", path: q + "/ack", body: `{"receipts":["{{r1}}"]}`, want: 409},
		{method: "POST", path: q + "/ack", body: `{"receipts":[]}`, want: 422},
		{method: "POST", path: q + "/receive", body: `{"topic":"mail","waitMs":0}`, want: 200, save: map[string]string{"r2": "messages.0.receipt"}},
		{method: "POST", path: q + "/nack", body: `{"receipt":"{{r2}}","delayMs":10,"error":"boom"}`, want: 200},
		{method: "POST", path: q + "/nack", body: `{"receipt":"{{r2}}"}`, want: 409},
		{method: "POST", path: q + "/nack", body: `{"receipt":"x","delayMs":99999999999999999999}`, want: 422},
		{method: "POST", path: q + "/messages", body: `{"messages":[{"id":"m4","payload":4}]}`, want: 200},
		{method: "POST", path: q + "/receive", want: 200, save: map[string]string{"r4": "messages.0.receipt"}},
		{method: "POST", path: q + "/dead", body: `{"receipt":"{{r4}}","reason":"bad"}`, want: 200},
		{method: "POST", path: q + "/dead", body: `{"receipt":"{{r4}}"}`, want: 409},
		{method: "POST", path: q + "/receive", body: `{"target":"nope"}`, want: 404},
		{method: "POST", path: q + "/receive", body: `{"waitMs":30000}`, want: 400},
		{method: "GET", path: q + "/stats", want: 200},
		{method: "GET", path: q + "/dead-letters?limit=10", want: 200},
		{method: "GET", path: q + "/dead-letters?target=nope", want: 404},
		{method: "DELETE", path: q + "/dead-letters/m4", want: 204},
		{method: "DELETE", path: q + "/dead-letters/m4", want: 404},
		{method: "POST", path: q + "/dead-letters/redrive", body: `{"ids":["m2"]}`, want: 200},
		{method: "POST", path: q + "/dead-letters/redrive", want: 200},
		{method: "POST", path: q + "/replay", body: `{"topics":["mail"]}`, want: 200},
		{method: "POST", path: q + "/replay", body: `{"topic":"mail"}`, want: 400},
		{method: "GET", path: "/api/v1/queues/app_test/jobs", want: 200},
		{method: "GET", path: "/api/v1/admin/replay", want: 200},
		{method: "GET", path: "/api/v1/admin/replay", hdr: noAuth, want: 401},

		// Batches and tokens.
		{method: "POST", path: "/api/v1/batch/app_test", body: `{"ops":[
			{"object":"order/b1","op":"set","slot":"s","value":1,"idempotencyKey":"b"},
			{"object":"order/b1","op":"increment","slot":"n"},
			{"object":"order/b1","op":"get","slot":"nope"},
			{"object":"order/b1","op":"delete","slot":"s"},
			{"object":"events/b1","op":"log.append","records":[{"body":1}]},
			{"object":"events/b1","op":"log.read","from":0},
			{"object":"jobs/b1","op":"queue.enqueue","messages":[{"payload":1}]}]}`, want: 200},
		{method: "POST", path: "/api/v1/batch/pk_test", body: `{"ops":[{"object":"order/b1","op":"nope"}]}`, want: 400},
		{method: "POST", path: "/api/v1/tokens/app_test", body: `{"capabilities":["object:read:order/*"],"ttl_seconds":60,"socket_id":"s1"}`, want: 200},
		{method: "POST", path: "/api/v1/tokens/app_test", body: `{"capabilities":["nope"]}`, want: 422},
		{method: "POST", path: "/api/v1/tokens/app_test", body: `{"capabilities":"x"}`, want: 400},

		// The websocket, refused before the upgrade (openSocket dials it).
		{method: "GET", path: "/socket/websocket?app_key=pk_test&vsn=2.0.0", hdr: noAuth, want: 426},
		{method: "GET", path: "/socket/websocket?app_key=pk_test", hdr: noAuth, want: 403},
		{method: "GET", path: "/socket/websocket?app_key=nope&vsn=2.0.0", hdr: noAuth, want: 403},
		{method: "POST", path: "/socket/websocket", hdr: noAuth, want: 405},
	}
}

// stubNode is a Node that fails the way a real node does only when it is
// overloaded or broken: its storage failed (so /healthz and /readyz are
// 503), it refuses large writes, and its objects answer by key: "overloaded"
// 429, "unavailable" 503, any other an error of no known kind (500).
type stubNode struct{}

func (*stubNode) Request(_ context.Context, id actors.ObjectID, _ any) (any, error) {
	switch id.Key {
	case "overloaded":
		return nil, &actors.Error{Kind: actors.KindOverloaded, Msg: "the object has too many requests in flight", RetryAfter: 100 * time.Millisecond}
	case "unavailable":
		return nil, &actors.Error{Kind: actors.KindUnavailable, Msg: "the node is shutting down", RetryAfter: time.Second}
	}
	return nil, errors.New("stub node: a bug")
}

func (*stubNode) Ready() bool { return false }

func (*stubNode) StorageHealth() (fatal, unavailable error) {
	err := errors.New("stub node: write /data/wal: input/output error")
	return err, err
}

func (*stubNode) RefusesWrites() bool { return true }

// stubTour gets the replies of a node under load or broken.
func stubTour() []tourStep {
	const o = "/api/v1/objects/app_test/order/"
	return []tourStep{
		{method: "GET", path: "/healthz", hdr: noAuth, want: 503},
		{method: "GET", path: "/readyz", hdr: noAuth, want: 503},
		{method: "GET", path: o + "overloaded", want: 429},
		{method: "POST", path: "/api/v1/queues/app_test/jobs/overloaded/messages", body: `{"messages":[{"payload":1}]}`, want: 429},
		{method: "GET", path: o + "unavailable", want: 503},
		{method: "PUT", path: o + "o1/s", body: `{"value":"` + strings.Repeat("x", refuseBodyFrom) + `"}`, want: 503},
		{method: "GET", path: o + "bug", want: 500},
		{method: "GET", path: "/api/v1/objects/app_test/order", want: 500},
	}
}

// touring runs tours against servers and checks every reply.
type touring struct {
	t    *testing.T
	d    *openAPI
	vars map[string]string
	// served counts the success replies (2xx, 101) of each operation.
	served map[string]int
	// statuses counts the replies checked, by status.
	statuses map[int]int
}

// run sends step on ts and checks its reply: the status the step wants, and
// the reply against the document. mux is the server's, to find the route the
// request matched.
func (tr *touring) run(ts *testServer, st tourStep) {
	t := tr.t
	t.Helper()
	path, body := tr.fill(st.path), tr.fill(st.body)
	var b any
	if body != "" {
		b = body
	}
	r := ts.do(st.method, path, b, st.hdr)
	what := st.method + " " + shortPath(path)
	if r.status != st.want {
		t.Errorf("%s: status %d, want %d; body %.300s", what, r.status, st.want, r.body)
		return
	}
	tr.statuses[r.status]++
	op := tr.operationOf(ts, st.method, path)
	switch {
	case op != "":
		if err := tr.d.checkReply(op, "", r); err != nil {
			t.Errorf("%s: %v; body %.300s", what, err, r.body)
		}
		if _, _, documented := tr.d.operation(op); documented && r.status < 300 {
			tr.served[op]++
			if err := tr.d.checkRequestBody(op, body); err != nil {
				t.Errorf("%s: %v", what, err)
			}
		}
	case r.status == http.StatusMethodNotAllowed:
		// No operation: the path is served with other methods. Each of
		// them documents the 405 (and its Allow header).
		tmpls := tr.d.templates(strings.SplitN(path, "?", 2)[0])
		if len(tmpls) == 0 {
			t.Errorf("%s: 405, but no documented path matches", what)
		}
		for _, tmpl := range tmpls {
			item, _ := tr.d.doc["paths"].(map[string]any)[tmpl].(map[string]any)
			for _, m := range openAPIMethods {
				if _, ok := item[m]; ok {
					if err := tr.d.checkReply(strings.ToUpper(m)+" "+tmpl, "", r); err != nil {
						t.Errorf("%s: %v", what, err)
					}
				}
			}
		}
	default:
		// No route: the path is no documented path's, and the reply is the
		// document's NoRoute (404), or the 400 of a path with a dot or
		// empty segment, refused before any route is looked up.
		p := strings.SplitN(path, "?", 2)[0]
		if tmpls := tr.d.templates(p); len(tmpls) > 0 && r.status == http.StatusNotFound {
			t.Errorf("%s: no route served it, but the document has %v", what, tmpls)
		}
		at := "/components/responses/NoRoute"
		if r.status == http.StatusBadRequest {
			at = "/components/responses/BadRequest"
		}
		if err := tr.d.checkReply("", at, r); err != nil {
			t.Errorf("%s: %v", what, err)
		}
	}
	for name, field := range st.save {
		v, ok := lookup(r.body, field)
		if !ok {
			t.Fatalf("%s: no %s in the reply %s", what, field, r.body)
		}
		tr.vars[name] = v
	}
}

// operationOf returns the documented operation ("METHOD /path") the server
// routes the request to, or "" when no route matched.
func (tr *touring) operationOf(ts *testServer, method, path string) string {
	req := httptest.NewRequest(method, path, nil)
	if badSegment(req.URL.EscapedPath()) != "" || badSegment(req.URL.Path) != "" {
		return "" // refused before routing (serveHTTP); the mux would clean it
	}
	_, pattern := ts.gw.mux.Handler(req)
	if pattern == "" {
		return ""
	}
	return routeOf(pattern)
}

// shortPath abbreviates the long segments of a path, for messages.
func shortPath(p string) string {
	segs := strings.Split(p, "/")
	for i, seg := range segs {
		if len(seg) > 40 {
			segs[i] = seg[:8] + "...(" + strconv.Itoa(len(seg)) + " bytes)"
		}
	}
	return strings.Join(segs, "/")
}

// fill replaces the {{name}}s of s with the values saved.
func (tr *touring) fill(s string) string {
	for k, v := range tr.vars {
		s = strings.ReplaceAll(s, "{{"+k+"}}", v)
	}
	return s
}

// lookup returns the value at a dotted path of a JSON body, as a string.
func lookup(body []byte, path string) (string, bool) {
	var v any
	if json.Unmarshal(body, &v) != nil {
		return "", false
	}
	for _, tok := range strings.Split(path, ".") {
		switch c := v.(type) {
		case map[string]any:
			v = c[tok]
		case []any:
			i, err := strconv.Atoi(tok)
			if err != nil || i < 0 || i >= len(c) {
				return "", false
			}
			v = c[i]
		default:
			return "", false
		}
	}
	if s, ok := v.(string); ok {
		return s, true
	}
	return "", false
}

// TestOpenAPI_RepliesMatchTheDocument: a tour calls every documented
// operation, and the replies, successes and errors, must be documented for
// the operation the request matched and match its schema.
func TestOpenAPI_RepliesMatchTheDocument(t *testing.T) {
	d := loadOpenAPI(t)
	tr := &touring{t: t, d: d, vars: map[string]string{}, served: map[string]int{}, statuses: map[int]int{}}

	ts := newTestServerWith(t, cluster.Config{TypeOptions: tourOptions}, func(c *Config) {
		m := metrics.New()
		c.Metrics, c.MetricsHandler = m, m.Handler()
	})
	for _, st := range nodeTour() {
		tr.run(ts, st)
	}
	tr.socketUpgrade(ts)

	// Every operation that needs the app's credentials refuses a request
	// without them, with the documented 401.
	for _, op := range d.operations() {
		o, _, _ := d.operation(op)
		if sec, own := o["security"].([]any); own && len(sec) == 0 {
			continue
		}
		method, tmpl, _ := strings.Cut(op, " ")
		tr.run(ts, tourStep{method: method, path: samplePath(tmpl), hdr: noAuth, want: http.StatusUnauthorized})
	}

	// Every operation refuses a name that breaks the naming rules (a path
	// parameter of 300 bytes; the body, if any, is the operation's example):
	// 400 for the object's type or key, 422 for a slot, consumer, alarm or
	// message id.
	long := strings.Repeat("x", 300)
	for _, op := range d.operations() {
		method, tmpl, _ := strings.Cut(op, " ")
		for param, want := range map[string]int{"{type}": 400, "{key}": 400, "{slot}": 422, "{consumer}": 422, "{name}": 422, "{id}": 422} {
			if strings.Contains(tmpl, param) {
				path := samplePath(strings.Replace(tmpl, param, long, 1))
				tr.run(ts, tourStep{method: method, path: path, body: d.example(op), want: want})
			}
		}
	}

	// Every operation that reads a body refuses one that is not JSON (400)
	// and one over 8 MiB (413), before it writes anything.
	tooBig := `{"value":"` + strings.Repeat("x", MaxBodyBytes) + `"}`
	for _, op := range d.operations() {
		if o, _, _ := d.operation(op); o["requestBody"] != nil {
			method, tmpl, _ := strings.Cut(op, " ")
			tr.run(ts, tourStep{method: method, path: samplePath(tmpl), body: "nope", want: http.StatusBadRequest})
			tr.run(ts, tourStep{method: method, path: samplePath(tmpl), body: tooBig, want: http.StatusRequestEntityTooLarge})
		}
	}

	stub := New(Config{Node: &stubNode{}, Apps: NewApps([]App{testApp})})
	_, url, stop := startFront(t, stub)
	defer func() { stub.Close(); stop() }()
	sts := &testServer{t: t, gw: stub, stop: stop, url: url}
	for _, st := range stubTour() {
		tr.run(sts, st)
	}

	for _, op := range d.operations() {
		if tr.served[op] == 0 {
			t.Errorf("the tour never got a success reply from %s: add a step", op)
		}
	}
	t.Logf("%d operations, replies checked by status: %v", len(d.operations()), tr.statuses)
}

// samplePath fills a path template's parameters with names of testApp's
// objects, of the tour's types (tourOptions).
func samplePath(tmpl string) string {
	typ := "order"
	switch {
	case strings.HasPrefix(tmpl, "/api/v1/logs/"):
		typ = "events"
	case strings.HasPrefix(tmpl, "/api/v1/queues/"):
		typ = "jobs"
	}
	return strings.NewReplacer("{app}", testApp.ID, "{type}", typ, "{key}", "o1", "{slot}", "s",
		"{consumer}", "c", "{name}", "x", "{id}", "m1").Replace(tmpl)
}

// example returns the JSON example of the operation's request body, or "".
func (d *openAPI) example(op string) string {
	_, ptr, _ := d.operation(op)
	v, ok := d.at(ptr + pointer("requestBody", "content", "application/json", "example"))
	if !ok {
		return ""
	}
	b, _ := json.Marshal(v)
	return string(b)
}

// socketUpgrade opens the websocket as a Phoenix client would, and checks
// the 101 against the document.
func (tr *touring) socketUpgrade(ts *testServer) {
	t := tr.t
	const op = "GET /socket/websocket"
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	u := "ws" + strings.TrimPrefix(ts.url, "http") + "/socket/websocket?app_key=" + testApp.Key + "&vsn=2.0.0"
	conn, resp, err := websocket.Dial(ctx, u, &websocket.DialOptions{Subprotocols: []string{"phoenix"}})
	if err != nil {
		t.Errorf("%s: %v", op, err)
		return
	}
	defer conn.Close(websocket.StatusNormalClosure, "")
	if conn.Subprotocol() != "phoenix" {
		t.Errorf("%s: subprotocol %q, want phoenix", op, conn.Subprotocol())
	}
	if err := tr.d.checkReply(op, "", reply{status: resp.StatusCode, header: resp.Header}); err != nil {
		t.Errorf("%s: %v", op, err)
	}
	tr.served[op]++
	tr.statuses[resp.StatusCode]++
	// The channel the document describes: a join of "socket" answers with
	// the socket's id.
	if err := conn.Write(ctx, websocket.MessageText, []byte(`["1","1","socket","phx_join",{}]`)); err != nil {
		t.Fatalf("%s: join: %v", op, err)
	}
	_, msg, err := conn.Read(ctx)
	if err != nil || !bytes.Contains(msg, []byte(`"phx_reply",{"response":{"socket_id":`)) {
		t.Errorf("%s: join of socket: %s %v", op, msg, err)
	}
}
