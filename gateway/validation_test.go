package gateway

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/holdfast/holdfast/actors"
	"github.com/holdfast/holdfast/cluster"
)

// Tests of issue 26, points 3 and 5: invalid UTF-8 is refused wherever a body
// is read, slot names follow one rule on every route, and every error has the
// status and code of spec/errors.md.

const (
	valObj   = "/api/v1/objects/app_test/events/v1"
	valLog   = "/api/v1/logs/app_test/events/v1"
	valQueue = "/api/v1/queues/app_test/events/v1"
	valAlarm = "/api/v1/alarms/app_test/events/v1"
)

// validationServer serves type "events" with a log and the default queue.
func validationServer(t *testing.T) *testServer {
	t.Helper()
	return newTestServer(t, cluster.Config{TypeOptions: func(typ string) actors.TypeOptions {
		o := actors.DefaultTypeOptions()
		o.Log = actors.LogOptions{MaxBatchSize: 100}
		return o
	}})
}

// wantState checks the reply of a GET of one of the object's other parts.
func wantState(t *testing.T, ts *testServer, path, want string) {
	t.Helper()
	wantJSON(t, ts.do("GET", path, nil, nil), http.StatusOK, want)
}

// TestValidation_InvalidUTF8BodyWritesNothing sends each write route a JSON body
// holding bytes that are not UTF-8: 400 bad_request, and nothing is written
// (read back through the routes that show it).
func TestValidation_InvalidUTF8BodyWritesNothing(t *testing.T) {
	ts := validationServer(t)
	mustDo(t, ts, "PUT", valObj+"/s", `{"value":"before"}`, http.StatusOK)
	// A message held by a consumer, for nack and dead.
	mustDo(t, ts, "POST", valQueue+"/messages", `{"messages":[{"id":"held","payload":1}]}`, http.StatusOK)
	var got received
	if err := json.Unmarshal(mustDo(t, ts, "POST", valQueue+"/receive", `{"max":1}`, http.StatusOK).body, &got); err != nil || len(got.Messages) != 1 {
		t.Fatalf("received %+v (%v)", got, err)
	}
	at := time.Now().Add(time.Hour).UnixMilli()
	bad := "a\xff\xfeb"
	cases := []struct{ name, method, path, body string }{
		{"put value", "PUT", valObj + "/s", `{"value":"` + bad + `"}`},
		{"put member", "PUT", valObj + "/s", `{"value":1,"` + bad + `":2}`},
		{"patch value", "PATCH", valObj, `{"s":"` + bad + `"}`},
		{"patch name", "PATCH", valObj, `{"` + bad + `":1}`},
		{"transaction value", "POST", valObj + "/transaction", `[{"op":"set","key":"s","value":"` + bad + `"}]`},
		{"transaction key", "POST", valObj + "/transaction", `[{"op":"set","key":"` + bad + `","value":1}]`},
		{"increment", "POST", valObj + "/n/increment", `{"by":1,"note":"` + bad + `"}`},
		{"append", "POST", valObj + "/l/append", `{"value":"` + bad + `"}`},
		{"event", "POST", valObj + "/events", `{"event":"run:x","payload":"` + bad + `"}`},
		{"log append", "POST", valLog + "/append", `{"records":[{"body":"` + bad + `"}]}`},
		{"log append key", "POST", valLog + "/append", `{"records":[{"body":1,"deduplicationKey":"` + bad + `"}]}`},
		{"enqueue payload", "POST", valQueue + "/messages", `{"messages":[{"payload":"` + bad + `"}]}`},
		{"enqueue id", "POST", valQueue + "/messages", `{"messages":[{"id":"` + bad + `","payload":1}]}`},
		{"enqueue topic", "POST", valQueue + "/messages", `{"messages":[{"topic":"` + bad + `","payload":1}]}`},
		{"nack error", "POST", valQueue + "/nack", `{"receipt":"` + got.Messages[0].Receipt + `","error":"` + bad + `"}`},
		{"dead reason", "POST", valQueue + "/dead", `{"receipt":"` + got.Messages[0].Receipt + `","reason":"` + bad + `"}`},
		{"alarm action", "PUT", valAlarm + "/a", fmt.Sprintf(`{"at":%d,"action":{"kind":"enqueue","topic":"t","payload":"%s"}}`, at, bad)},
		{"token", "POST", "/api/v1/tokens/app_test", `{"capabilities":["read:events:` + bad + `"]}`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			defer ts.bind(t)()
			r := ts.do(c.method, c.path, c.body, nil)
			wantError(t, r, http.StatusBadRequest, "bad_request", nil)
			if msg := r.json(t)["error"].(string); !strings.Contains(msg, "not valid UTF-8") {
				t.Errorf("message %q does not say the body is not valid UTF-8", msg)
			}
		})
	}
	wantSnap(t, ts, "events", "v1", 1, map[string]string{"s": `"before"`})
	wantState(t, ts, valLog+"/bounds", `{"oldestOffset":0,"hotOffset":0,"nextOffset":0}`)
	wantState(t, ts, valQueue+"/stats", `{"pending":0,"delayed":0,"processing":1,"complete":0,"failed":0}`)
	wantState(t, ts, valAlarm+"/", `{"alarms":[]}`)
}

// TestValidation_LoneSurrogateEscape: a JSON escape that names half a UTF-16
// pair denotes no Unicode text either (encoding/json would turn it into
// U+FFFD); a proper pair and an escaped backslash are fine.
func TestValidation_LoneSurrogateEscape(t *testing.T) {
	ts := validationServer(t)
	for _, body := range []string{`{"\ud800":1}`, `{"s":"\udc00"}`, `{"s":"x\ud800\u0041"}`, `{"s":"\\\ud800"}`} {
		r := ts.do("PATCH", valObj, body, nil)
		wantError(t, r, http.StatusBadRequest, "bad_request", nil)
	}
	wantSnap(t, ts, "events", "v1", 0, nil)
	mustDo(t, ts, "PATCH", valObj, `{"p":"\ud83d\ude00","e":"\\ud800","\u00e9":1}`, http.StatusOK)
	wantSnap(t, ts, "events", "v1", 1, map[string]string{"p": `"\ud83d\ude00"`, "e": `"\\ud800"`, "é": "1"})
}

// TestValidation_SlotNameOneRule: a slot name gets the same status and code
// whether it comes in the path (PUT, GET, DELETE, increment, append) or in a
// body (PATCH, transaction).
func TestValidation_SlotNameOneRule(t *testing.T) {
	ts := validationServer(t)
	type route struct{ name, method, path, body string }
	routes := func(esc, raw string) []route {
		q, _ := json.Marshal(raw)
		return []route{
			{"put", "PUT", valObj + "/" + esc, `{"value":1}`},
			{"get", "GET", valObj + "/" + esc, ""},
			{"delete", "DELETE", valObj + "/" + esc, ""},
			{"increment", "POST", valObj + "/" + esc + "/increment", ""},
			{"append", "POST", valObj + "/" + esc + "/append", `{"value":1}`},
			{"patch", "PATCH", valObj, `{` + string(q) + `:1}`},
			{"transaction", "POST", valObj + "/transaction", `[{"op":"set","key":` + string(q) + `,"value":1}]`},
		}
	}
	for _, c := range []struct {
		name, esc, raw string
		status         int
		code           string
	}{
		// Not UTF-8: malformed wherever it is (a body holding it is not JSON).
		{"not utf-8", "%FF%FE", "\xff\xfe", http.StatusBadRequest, "bad_request"},
		{"slash", "a%2Fb", "a/b", http.StatusUnprocessableEntity, "invalid"},
		{"too long", strings.Repeat("n", 257), strings.Repeat("n", 257), http.StatusUnprocessableEntity, "invalid"},
	} {
		for _, rt := range routes(c.esc, c.raw) {
			t.Run(c.name+"/"+rt.name, func(t *testing.T) {
				defer ts.bind(t)()
				var body any
				if rt.body != "" {
					body = rt.body
				}
				// PATCH's json.Marshal of invalid UTF-8 already wrote U+FFFD:
				// send the raw bytes.
				if rt.method == "PATCH" && c.raw == "\xff\xfe" {
					body = "{\"\xff\xfe\":1}"
				}
				if rt.name == "transaction" && c.raw == "\xff\xfe" {
					body = "[{\"op\":\"set\",\"key\":\"\xff\xfe\",\"value\":1}]"
				}
				wantError(t, ts.do(rt.method, rt.path, body, nil), c.status, c.code, nil)
			})
		}
	}
	wantSnap(t, ts, "events", "v1", 0, nil)
	// The reserved names: every write refuses them the same way (GET /log
	// and POST /transaction are routes).
	for _, rt := range []route{
		{"put log", "PUT", valObj + "/log", `{"value":1}`},
		{"get transaction", "GET", valObj + "/transaction", ""},
		{"delete log", "DELETE", valObj + "/log", ""},
		{"patch transaction", "PATCH", valObj, `{"transaction":1}`},
		{"transaction log", "POST", valObj + "/transaction", `[{"op":"set","key":"log","value":1}]`},
	} {
		var body any
		if rt.body != "" {
			body = rt.body
		}
		wantError(t, ts.do(rt.method, rt.path, body, nil), http.StatusUnprocessableEntity, "invalid", nil)
	}
	wantSnap(t, ts, "events", "v1", 0, nil)
}

// TestValidation_OtherNames: alarm names, log consumer names and queue message
// ids follow the same rule as slot names: not UTF-8 is 400, any other breach
// of the name's rule is 422.
func TestValidation_OtherNames(t *testing.T) {
	ts := validationServer(t)
	at := time.Now().Add(time.Hour).UnixMilli()
	alarm := fmt.Sprintf(`{"at":%d,"action":{"kind":"trim"}}`, at)
	long := func(n int) string { return strings.Repeat("n", n) }
	for _, c := range []struct {
		name, method, path, body string
		status                   int
		code                     string
	}{
		{"alarm put not utf-8", "PUT", valAlarm + "/%FF", alarm, 400, "bad_request"},
		{"alarm get not utf-8", "GET", valAlarm + "/%FF", "", 400, "bad_request"},
		{"alarm put slash", "PUT", valAlarm + "/a%2Fb", alarm, 422, "invalid"},
		{"alarm put too long", "PUT", valAlarm + "/" + long(actors.MaxAlarmName+1), alarm, 422, "invalid"},
		{"alarm get too long", "GET", valAlarm + "/" + long(actors.MaxAlarmName+1), "", 422, "invalid"},
		{"alarm delete slash", "DELETE", valAlarm + "/a%2Fb", "", 422, "invalid"},
		{"consumer commit not utf-8", "PUT", valLog + "/cursors/%FF", `{"offset":0}`, 400, "bad_request"},
		{"consumer commit slash", "PUT", valLog + "/cursors/a%2Fb", `{"offset":0}`, 422, "invalid"},
		{"consumer get too long", "GET", valLog + "/cursors/" + long(257), "", 422, "invalid"},
		{"consumer commit too long", "PUT", valLog + "/cursors/" + long(257), `{"offset":0}`, 422, "invalid"},
		{"message id too long", "POST", valQueue + "/messages", `{"messages":[{"id":"` + long(129) + `","payload":1}]}`, 422, "invalid"},
		{"message id empty", "POST", valQueue + "/messages", `{"messages":[{"id":"","payload":1}]}`, 422, "invalid"},
		{"message id control", "POST", valQueue + "/messages", `{"messages":[{"id":"a\u0001","payload":1}]}`, 422, "invalid"},
		{"message get not utf-8", "GET", valQueue + "/messages/%FF", "", 400, "bad_request"},
		{"message get too long", "GET", valQueue + "/messages/" + long(129), "", 422, "invalid"},
		{"dead letter delete too long", "DELETE", valQueue + "/dead-letters/" + long(129), "", 422, "invalid"},
		{"redrive id too long", "POST", valQueue + "/dead-letters/redrive", `{"ids":["` + long(129) + `"]}`, 422, "invalid"},
	} {
		t.Run(c.name, func(t *testing.T) {
			defer ts.bind(t)()
			var body any
			if c.body != "" {
				body = c.body
			}
			wantError(t, ts.do(c.method, c.path, body, nil), c.status, c.code, nil)
		})
	}
	wantState(t, ts, valAlarm+"/", `{"alarms":[]}`)
	wantState(t, ts, valLog+"/cursors", `{"cursors":{}}`)
	wantState(t, ts, valQueue+"/stats", `{"pending":0,"delayed":0,"processing":0,"complete":0,"failed":0}`)
}

// TestValidation_RefusalStatuses: a well-formed request that is refused is 422
// (spec/errors.md), and an overflowing delay says what its maximum is.
func TestValidation_RefusalStatuses(t *testing.T) {
	ts := validationServer(t)
	at := time.Now().Add(time.Hour).UnixMilli()
	mustDo(t, ts, "PUT", valObj+"/str", `{"value":"text"}`, http.StatusOK)
	maxDelay := fmt.Sprint(int64(1<<63-1) / int64(time.Millisecond))
	for _, c := range []struct {
		name, method, path, body string
		mention                  []string // in the message
	}{
		{"empty enqueue", "POST", valQueue + "/messages", `{"messages":[]}`, nil},
		{"message id over 128 bytes", "POST", valQueue + "/messages", `{"messages":[{"id":"` + strings.Repeat("i", 129) + `","payload":1}]}`, []string{"128"}},
		{"unknown alarm action kind", "PUT", valAlarm + "/a", fmt.Sprintf(`{"at":%d,"action":{"kind":"explode"}}`, at), []string{"explode"}},
		{"increment on a string", "POST", valObj + "/str/increment", `{"by":1}`, nil},
		{"delayMs past a duration", "POST", valQueue + "/messages", `{"messages":[{"payload":1,"delayMs":9223372036854775807}]}`, []string{"delayMs", maxDelay}},
		{"delayMs past int64", "POST", valQueue + "/messages", `{"messages":[{"payload":1,"delayMs":92233720368547758070}]}`, []string{"delayMs", maxDelay}},
		{"delayMs just past the maximum", "POST", valQueue + "/messages", `{"messages":[{"payload":1,"delayMs":` + maxDelay + `1}]}`, []string{"delayMs", maxDelay}},
		{"nack delayMs overflow", "POST", valQueue + "/nack", `{"receipt":"r","delayMs":9223372036854775807}`, []string{"delayMs", maxDelay}},
	} {
		t.Run(c.name, func(t *testing.T) {
			defer ts.bind(t)()
			r := ts.do(c.method, c.path, c.body, nil)
			wantError(t, r, http.StatusUnprocessableEntity, "invalid", nil)
			msg := r.json(t)["error"].(string)
			for _, m := range c.mention {
				if !strings.Contains(msg, m) {
					t.Errorf("message %q does not mention %q", msg, m)
				}
			}
		})
	}
	// A delay at the maximum is taken; a negative or fractional one is a bad request.
	wantState(t, ts, valQueue+"/stats", `{"pending":0,"delayed":0,"processing":0,"complete":0,"failed":0}`)
	mustDo(t, ts, "POST", valQueue+"/messages", `{"messages":[{"id":"far","payload":1,"delayMs":`+maxDelay+`}]}`, http.StatusOK)
	wantState(t, ts, valQueue+"/stats", `{"pending":0,"delayed":1,"processing":0,"complete":0,"failed":0}`)
	for _, d := range []string{"-1", "-92233720368547758070", "1.5", "1e3", `"1"`} {
		wantError(t, ts.do("POST", valQueue+"/messages", `{"messages":[{"payload":1,"delayMs":`+d+`}]}`, nil), http.StatusBadRequest, "bad_request", nil)
	}
}

// TestValidation_EveryErrorHasCode walks error replies of every route family:
// each one but the seed's 401 is JSON with a non-empty "code".
func TestValidation_EveryErrorHasCode(t *testing.T) {
	ts := validationServer(t)
	mustDo(t, ts, "PUT", valObj+"/str", `{"value":"text"}`, http.StatusOK)
	mustDo(t, ts, "PUT", valObj+"/list", `{"value":[1]}`, http.StatusOK)
	big := `{"value":"` + strings.Repeat("x", MaxBodyBytes) + `"}`
	cases := []struct{ method, path, body string }{
		{"GET", "/nowhere", ""},
		{"PUT", "/healthz", ""},
		{"GET", valObj + "/missing", ""},
		{"PUT", valObj + "/s", `{"value":null}`},
		{"PUT", valObj + "/s", `{}`},
		{"PUT", valObj + "/s", `not json`},
		{"PUT", valObj + "/s", big},
		{"PUT", valObj + "/s", `{"value":"` + strings.Repeat("x", 1<<20) + `"}`},
		{"POST", valObj + "/str/increment", `{"by":1}`},
		{"POST", valObj + "/str/increment", `{"by":"1"}`},
		{"POST", valObj + "/str/append", `{"value":1}`},
		{"POST", valObj + "/transaction", `[]`},
		{"POST", valObj + "/transaction", `[{"op":"explode","key":"a"}]`},
		{"POST", valObj + "/transaction", `[1]`},
		{"POST", valObj + "/list/increment", `{"by":1}`},
		{"PATCH", valObj, `[1]`},
		{"PUT", valObj + "/s", `{"value":1}`}, // with an Idempotency-Key that is too long, below
		{"GET", valObj + "/log?after=x", ""},
		{"POST", valObj + "/events", `{"event":"x"}`},
		{"POST", valObj + "/events", `{"event":"nope:x"}`},
		{"POST", valLog + "/append", `{"records":[]}`},
		{"POST", valLog + "/append", `{"records":[{"body":1,"deduplicationKey":""}]}`},
		{"GET", valLog + "/records?from=x", ""},
		{"GET", valLog + "/cursors/nobody", ""},
		{"PUT", valLog + "/cursors/c", `{"offset":5}`},
		{"POST", valLog + "/consumers/c/lease", ""},
		{"POST", valLog + "/consumers/c/ack", `{"batchId":"b"}`},
		{"POST", valQueue + "/messages", `{"messages":[]}`},
		{"POST", valQueue + "/messages", `{"messages":[{"payload":1,"deliverAt":1,"delayMs":1}]}`},
		{"GET", valQueue + "/messages/unknown", ""},
		{"POST", valQueue + "/receive", `{"waitMs":999999}`},
		{"POST", valQueue + "/ack", `{"receipts":["nope"]}`},
		{"POST", valQueue + "/nack", `{"receipt":"nope"}`},
		{"DELETE", valQueue + "/dead-letters/nope", ""},
		{"PUT", valAlarm + "/a", `{"at":1,"action":{"kind":"explode"}}`},
		{"PUT", valAlarm + "/a", `{"at":-5,"action":{"kind":"trim"}}`},
		{"GET", valAlarm + "/none", ""},
		{"DELETE", valAlarm + "/none", ""},
		{"GET", valAlarm + "/?limit=0", ""},
		{"POST", "/api/v1/tokens/app_test", `{"capabilities":[]}`},
		{"POST", "/api/v1/tokens/app_test", `{`},
		{"GET", "/socket/websocket?vsn=1.0.0", ""},
		{"GET", "/socket/websocket?vsn=2.0.0&app_key=nope", ""},
		{"GET", "/api/v1/objects/app_test/a%3Ab/k", ""},
		{"GET", "/api/v1/objects/app_test//k", ""},
	}
	for i, c := range cases {
		t.Run(fmt.Sprintf("%d %s %s", i, c.method, c.path), func(t *testing.T) {
			defer ts.bind(t)()
			var body any
			if c.body != "" {
				body = c.body
			}
			var hdr map[string]string
			if i == 16 {
				hdr = idemHdr(strings.Repeat("k", 200))
			}
			r := ts.do(c.method, c.path, body, hdr)
			if r.status < 400 || r.status == http.StatusUnauthorized {
				t.Fatalf("status %d, want an error; body %s", r.status, r.body)
			}
			var m map[string]any
			if err := json.Unmarshal(r.body, &m); err != nil {
				t.Fatalf("status %d: body %q is not JSON", r.status, r.body)
			}
			if code, _ := m["code"].(string); code == "" {
				t.Errorf("status %d: body %s has no code", r.status, r.body)
			}
			if msg, _ := m["error"].(string); msg == "" {
				t.Errorf("status %d: body %s has no error message", r.status, r.body)
			}
		})
	}
}

// TestValidation_HeaderTooLarge431 sends a header past net/http's limit over a
// real connection through the gateway's listener: the 431 is JSON with a code
// and a request id, not net/http's text.
func TestValidation_HeaderTooLarge431(t *testing.T) {
	ts := validationServer(t)
	srv := httptest.NewUnstartedServer(ts.gw.Handler())
	srv.Listener = Listener(srv.Listener)
	srv.Start()
	t.Cleanup(srv.Close)

	for _, size := range []int{http.DefaultMaxHeaderBytes + 8192, 4 * http.DefaultMaxHeaderBytes} {
		conn, err := net.Dial("tcp", srv.Listener.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		// The server stops reading at its limit: the rest may never be taken,
		// so the request is written from its own goroutine, and the test
		// waits for it after the connection is closed.
		wrote := make(chan struct{})
		go func() {
			defer close(wrote)
			req := "GET " + valObj + " HTTP/1.1\r\nHost: x\r\nX-App-Key: pk_test\r\nX-Big: " + strings.Repeat("b", size) + "\r\n\r\n"
			_, _ = io.WriteString(conn, req)
		}()
		_ = conn.SetReadDeadline(time.Now().Add(30 * time.Second))
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		if err != nil {
			conn.Close()
			<-wrote
			t.Fatalf("header of %d bytes: read the reply: %v", size, err)
		}
		body, err := io.ReadAll(resp.Body)
		conn.Close()
		<-wrote
		if err != nil {
			t.Fatalf("read the body: %v", err)
		}
		r := reply{status: resp.StatusCode, header: resp.Header, body: body}
		wantError(t, r, http.StatusRequestHeaderFieldsTooLarge, "too_large", nil)
		if !bytes.Contains(body, []byte("header")) {
			t.Errorf("message %s does not name the header", body)
		}
	}
	// The connections after it are served as before.
	resp, err := http.Get(srv.URL + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("healthz: %d", resp.StatusCode)
	}
}

func TestLoneSurrogate(t *testing.T) {
	for in, want := range map[string]string{
		`"plain"`:                  "",
		`"\ud83d\ude00"`:           "",
		`"\uD83D\uDE00"`:           "",
		`"\\ud800"`:                "",
		`"\\\\ud800"`:              "",
		`"\u00e9\n\t\"\/"`:         "",
		`"\ud800"`:                 `\ud800`,
		`"\uDFFF"`:                 `\uDFFF`,
		`"\ud800\u0041"`:           `\ud800`,
		`"\ud800\ud800"`:           `\ud800`,
		`"\ude00\ud83d"`:           `\ude00`,
		`"\\\ud800"`:               `\ud800`,
		`"ok \ud83d\ude00 \udc00"`: `\udc00`,
		`"\ud800`:                  `\ud800`,
		`"\ud8`:                    "",
		`\`:                        "",
	} {
		got, ok := loneSurrogate([]byte(in))
		if got != want || ok != (want != "") {
			t.Errorf("loneSurrogate(%s) = %q, %v; want %q", in, got, ok, want)
		}
	}
}

// TestToAPIError_EveryKindHasCode: whatever the actors return, the reply
// names a code, a conflict without one of its own included.
func TestToAPIError_EveryKindHasCode(t *testing.T) {
	errs := []error{&actors.LogTruncatedError{After: 1, Oldest: 5}, &actors.OffsetTruncatedError{Requested: 1, Oldest: 5}, io.EOF}
	for k := actors.KindInternal; k <= actors.KindConflict; k++ {
		errs = append(errs, &actors.Error{Kind: k, Msg: "m"})
	}
	for _, err := range errs {
		e := toAPIError(err, "rid")
		if code, _ := e.body["code"].(string); code == "" || e.status < 400 {
			t.Errorf("%v: status %d, body %v: no code", err, e.status, e.body)
		}
	}
}
