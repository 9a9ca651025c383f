package gateway

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"reflect"
	"strings"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/holdfast/holdfast/actors"
)

// Capability tokens (spec/auth.md): JWTs signed with HMAC-SHA256 under the App
// Secret that let a browser join an object's channel without the secret.

const (
	capReadPrefix   = "object:read:"
	defaultTokenTTL = 300
	maxTokenTTL     = 86400
	maxCapabilities = 100
	maxSocketIDLen  = 128
)

// tokenClaims are a capability token's claims: iss (App ID), exp, caps, sid.
type tokenClaims struct {
	Caps []string `json:"caps"`
	Sid  string   `json:"sid,omitempty"`
	jwt.RegisteredClaims
}

// capability is one parsed object:read:{type}/{key}; key "*" is every key.
type capability struct{ typ, key string }

// parseCapability parses and checks one capability string.
func parseCapability(s string) (capability, error) {
	rest, ok := strings.CutPrefix(s, capReadPrefix)
	if !ok {
		return capability{}, fmt.Errorf("capability %q must be object:read:{type}/{key}", s)
	}
	typ, key, ok := strings.Cut(rest, "/")
	if !ok {
		return capability{}, fmt.Errorf("capability %q must be object:read:{type}/{key}", s)
	}
	id := actors.ObjectID{App: "app", Type: typ, Key: key}
	if err := actors.ValidateID(id); err != nil {
		return capability{}, fmt.Errorf("capability %q: %s", s, userMessage(err))
	}
	return capability{typ: typ, key: key}, nil
}

// grants reports whether caps allow reading (typ, key).
func grants(caps []string, typ, key string) bool {
	for _, s := range caps {
		c, err := parseCapability(s)
		if err == nil && c.typ == typ && (c.key == key || c.key == "*") {
			return true
		}
	}
	return false
}

type mintRequest struct {
	Capabilities []string `json:"capabilities"`
	TTLSeconds   *int64   `json:"ttl_seconds"`
	SocketID     *string  `json:"socket_id"`
}

// mintToken serves POST /api/v1/tokens/{app}.
func (s *Server) mintToken(w http.ResponseWriter, r *http.Request) {
	app := s.authApp(w, r)
	if app == nil {
		return
	}
	body, aerr := readBody(w, r)
	if aerr != nil {
		aerr.write(w)
		return
	}
	var req mintRequest
	if err := strictJSON(body, &req); err != nil {
		badRequest("the body must be a JSON object with capabilities, ttl_seconds and socket_id: " + jsonProblem(err)).write(w)
		return
	}
	if len(req.Capabilities) == 0 {
		invalid("capabilities must list at least one capability").write(w)
		return
	}
	if len(req.Capabilities) > maxCapabilities {
		invalid(fmt.Sprintf("at most %d capabilities per token", maxCapabilities)).write(w)
		return
	}
	for _, c := range req.Capabilities {
		if _, err := parseCapability(c); err != nil {
			invalid(err.Error()).write(w)
			return
		}
	}
	ttl := int64(defaultTokenTTL)
	if req.TTLSeconds != nil {
		ttl = *req.TTLSeconds
	}
	if ttl < 1 || ttl > maxTokenTTL {
		invalid(fmt.Sprintf("ttl_seconds must be 1 to %d", maxTokenTTL)).write(w)
		return
	}
	var sid string
	if req.SocketID != nil {
		sid = *req.SocketID
		if sid == "" || len(sid) > maxSocketIDLen {
			invalid(fmt.Sprintf("socket_id must be 1 to %d bytes", maxSocketIDLen)).write(w)
			return
		}
	}
	exp := s.now().Add(time.Duration(ttl) * time.Second)
	claims := tokenClaims{
		Caps: req.Capabilities,
		Sid:  sid,
		RegisteredClaims: jwt.RegisteredClaims{
			Issuer:    app.ID,
			ExpiresAt: jwt.NewNumericDate(exp),
		},
	}
	token, err := jwt.NewWithClaims(jwt.SigningMethodHS256, claims).SignedString([]byte(app.Secret))
	if err != nil {
		s.fail(w, r, err)
		return
	}
	// jwt's NumericDate has second precision: report the expiry the token holds.
	writeJSON(w, http.StatusOK, map[string]any{"token": token, "expires_at": claims.ExpiresAt.Unix() * 1000})
}

// errInvalidToken is every verification failure: the join reason is the same
// whatever the cause, so that a client learns nothing about the secret.
var errInvalidToken = errors.New("invalid token")

// verifyToken checks a token for app on socket socketID and returns its
// capabilities.
func (s *Server) verifyToken(app *App, socketID, token string) ([]string, error) {
	var claims tokenClaims
	_, err := jwt.ParseWithClaims(token, &claims, func(*jwt.Token) (any, error) { return []byte(app.Secret), nil },
		jwt.WithValidMethods([]string{jwt.SigningMethodHS256.Alg()}),
		jwt.WithIssuer(app.ID),
		jwt.WithExpirationRequired(),
		jwt.WithTimeFunc(s.now),
	)
	if err != nil {
		return nil, errInvalidToken
	}
	if claims.Sid != "" && claims.Sid != socketID {
		return nil, errInvalidToken
	}
	return claims.Caps, nil
}

// jsonProblem says what is wrong with a JSON body in the API's terms (never the
// Go decoder's, which names Go types).
func jsonProblem(err error) string {
	var te *json.UnmarshalTypeError
	var se *json.SyntaxError
	switch {
	case errors.As(err, &te):
		want := map[reflect.Kind]string{reflect.Slice: "an array", reflect.String: "a string", reflect.Int: "an integer",
			reflect.Int64: "an integer", reflect.Struct: "an object", reflect.Map: "an object", reflect.Bool: "a boolean"}[te.Type.Kind()]
		if want == "" {
			want = "of another type"
		}
		if te.Field == "" {
			return "the body is " + te.Value + ", want an object"
		}
		return fmt.Sprintf("%s is %s, want %s", te.Field, te.Value, want)
	case errors.As(err, &se), errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, io.EOF):
		return "malformed JSON"
	case strings.HasPrefix(err.Error(), "json: unknown field "):
		return "unknown member " + strings.TrimPrefix(err.Error(), "json: unknown field ")
	}
	return err.Error()
}

// strictJSON decodes one JSON value into v, refusing unknown fields and trailing data.
func strictJSON(b []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return err
	}
	if dec.More() {
		return errors.New("trailing data after the JSON value")
	}
	return nil
}
