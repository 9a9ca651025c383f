package gateway

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"time"

	"github.com/holdfast/holdfast/actors"
)

// apiError is an error reply of spec/errors.md.
type apiError struct {
	status int
	body   map[string]any
	header http.Header
}

var unauthorizedBody = []byte(`{"errors":[{"status":"401","title":"Unauthorized"}]}`)

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		status = http.StatusInternalServerError
		b = []byte(`{"error":"internal error","code":"internal"}`)
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(append(b, '\n'))
}

func writeUnauthorized(w http.ResponseWriter) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusUnauthorized)
	_, _ = w.Write(unauthorizedBody)
}

func errBody(msg, code string) map[string]any { return map[string]any{"error": msg, "code": code} }

func badRequest(msg string) *apiError {
	return &apiError{status: http.StatusBadRequest, body: errBody(msg, "bad_request")}
}

func notFound(msg string) *apiError {
	return &apiError{status: http.StatusNotFound, body: errBody(msg, "not_found")}
}

// invalid is a 422: a well-formed request that is refused.
func invalid(msg string) *apiError {
	return &apiError{status: http.StatusUnprocessableEntity, body: errBody(msg, "invalid")}
}

// userMessage is the client-safe message of an error from the actors.
func userMessage(err error) string {
	var e *actors.Error
	if errors.As(err, &e) {
		return e.Msg
	}
	return "internal error"
}

func tooLarge(msg string) *apiError {
	return &apiError{status: http.StatusRequestEntityTooLarge, body: errBody(msg, "too_large")}
}

// toAPIError maps an error from the actors to its reply. Errors of unknown kind
// are internal: logged with the request id, which the body repeats. Every body
// carries a code, the seed's routes' included (issue 26: a client switches on
// the code, and a member more does not break a client of the seed's shape).
func toAPIError(err error, requestID string) *apiError {
	var trunc *actors.LogTruncatedError
	if errors.As(err, &trunc) {
		msg := fmt.Sprintf("the change log no longer holds the entries after %d; the oldest held is %d", trunc.After, trunc.Oldest)
		if trunc.After > trunc.Newest {
			// A log_id the object never issued (issue 26): it lost its state
			// and went on from a higher floor, or the client made it up.
			msg = fmt.Sprintf("the object never issued log_id %d (its newest is %d; it may have lost its state): read its state again and follow on from its log_id", trunc.After, trunc.Newest)
		}
		return &apiError{status: http.StatusGone, body: map[string]any{
			"error": msg, "code": "log_truncated", "after": trunc.After, "oldest_log_id": trunc.Oldest,
		}}
	}
	var off *actors.OffsetTruncatedError
	if errors.As(err, &off) {
		return &apiError{status: http.StatusGone, body: map[string]any{
			"error": fmt.Sprintf("offset %d is no longer in the log; the oldest readable offset is %d", off.Requested, off.Oldest), "code": "log_truncated",
			"requestedOffset": off.Requested, "oldestOffset": off.Oldest,
		}}
	}
	var e *actors.Error
	if !errors.As(err, &e) {
		return internalError(requestID)
	}
	switch e.Kind {
	case actors.KindBadRequest:
		return badRequest(e.Msg)
	case actors.KindNotFound:
		return notFound(e.Msg)
	case actors.KindInvalid:
		return invalid(e.Msg)
	case actors.KindTooLarge:
		return tooLarge(e.Msg)
	case actors.KindOverloaded:
		return retryable(http.StatusTooManyRequests, e.Msg, "overloaded", e.RetryAfter)
	case actors.KindUnavailable:
		return retryable(http.StatusServiceUnavailable, e.Msg, "unavailable", e.RetryAfter)
	case actors.KindConflict:
		code := e.Code
		if code == "" {
			code = "conflict" // every conflict the actors raise names its code; never an empty one
		}
		return &apiError{status: http.StatusConflict, body: errBody(e.Msg, code)}
	}
	return internalError(requestID)
}

func internalError(requestID string) *apiError {
	return &apiError{status: http.StatusInternalServerError, body: map[string]any{
		"error": "internal error", "code": "internal", "request_id": requestID,
	}}
}

func retryable(status int, msg, code string, after time.Duration) *apiError {
	e := &apiError{status: status, body: errBody(msg, code)}
	if after > 0 {
		ms := after.Milliseconds()
		e.body["retryAfterMs"] = ms
		e.header = http.Header{"Retry-After": {strconv.Itoa(int(math.Ceil(after.Seconds())))}}
	}
	return e
}

func (e *apiError) write(w http.ResponseWriter) {
	for k, v := range e.header {
		w.Header()[k] = v
	}
	// Every error repeats the request's id (set as X-Request-Id when it came in),
	// so that a user can quote it and an operator find it in the log.
	if id := w.Header().Get("X-Request-Id"); id != "" && e.body["request_id"] == nil {
		e.body["request_id"] = id
	}
	writeJSON(w, e.status, e.body)
}
