package client

import (
	"net/http"
	"testing"
	"time"
)

func TestDecodeError(t *testing.T) {
	e := decodeError(503, http.Header{"X-Request-Id": {"h1"}}, []byte(`{"error":"busy","code":"unavailable","retryAfterMs":1500,"request_id":"b1"}`))
	if e.Message != "busy" || e.Code != "unavailable" || e.RequestID != "b1" || e.RetryAfter != 1500*time.Millisecond {
		t.Fatalf("%+v", e)
	}
	if d, ok := Retryable(e); !ok || d != 1500*time.Millisecond {
		t.Fatalf("Retryable: %v %v", d, ok)
	}
	if _, ok := Retryable(decodeError(422, nil, []byte(`{"error":"x","code":"invalid"}`))); ok {
		t.Fatal("a 422 is retryable")
	}
	u := decodeError(401, http.Header{"X-Request-Id": {"h2"}}, []byte(`{"errors":[{"status":"401","title":"Unauthorized"}]}`))
	if u.Message == "" || u.RequestID != "h2" || u.Error() == "" {
		t.Fatalf("401: %+v", u)
	}
	if p := decodeError(502, nil, []byte("bad gateway\n")); p.Message != "bad gateway" {
		t.Fatalf("a body that is not JSON: %+v", p)
	}
}
