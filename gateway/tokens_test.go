package gateway

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/holdfast/holdfast/cluster"
)

// mint asks for a token and returns it, failing the test on any other reply.
func (ts *testServer) mint(t *testing.T, body map[string]any) (string, int64) {
	t.Helper()
	r := ts.do("POST", "/api/v1/tokens/"+testApp.ID, body, nil)
	if r.status != 200 {
		t.Fatalf("mint %v: %d %s", body, r.status, r.body)
	}
	var out struct {
		Token     string `json:"token"`
		ExpiresAt int64  `json:"expires_at"`
	}
	if err := json.Unmarshal(r.body, &out); err != nil || out.Token == "" {
		t.Fatalf("mint reply %s", r.body)
	}
	return out.Token, out.ExpiresAt
}

func TestTokens_MintedTokenIsAJWTWithTheSpecClaims(t *testing.T) {
	ts := newTestServer(t, cluster.Config{})
	before := time.Now()
	tok, exp := ts.mint(t, map[string]any{"capabilities": []string{"object:read:order/o1"}, "socket_id": "s1"})
	var claims tokenClaims
	parsed, err := jwt.ParseWithClaims(tok, &claims, func(*jwt.Token) (any, error) { return []byte(testApp.Secret), nil })
	if err != nil || parsed.Method.Alg() != "HS256" {
		t.Fatalf("token does not verify as HS256 under the App Secret: %v", err)
	}
	if claims.Issuer != testApp.ID || claims.Sid != "s1" || len(claims.Caps) != 1 || claims.Caps[0] != "object:read:order/o1" {
		t.Fatalf("claims %+v", claims)
	}
	// ttl_seconds defaults to 300; expires_at is the exp claim in ms.
	if d := claims.ExpiresAt.Sub(before); d < 299*time.Second || d > 302*time.Second {
		t.Fatalf("exp %v after minting, want 300s", d)
	}
	if exp != claims.ExpiresAt.UnixMilli() {
		t.Fatalf("expires_at %d, exp claim %d", exp, claims.ExpiresAt.UnixMilli())
	}
	// By App Key too, and with an explicit ttl.
	r := ts.do("POST", "/api/v1/tokens/"+testApp.Key, map[string]any{"capabilities": []string{"object:read:order/*"}, "ttl_seconds": 86400}, nil)
	if r.status != 200 {
		t.Fatalf("mint by app key: %d %s", r.status, r.body)
	}
}

func TestTokens_MintRefusals(t *testing.T) {
	ts := newTestServer(t, cluster.Config{})
	path := "/api/v1/tokens/" + testApp.ID
	for _, c := range []struct {
		body   string
		status int
	}{
		{`{"capabilities":["object:write:order/o1"]}`, 422},
		{`{"capabilities":["object:read:order"]}`, 422},
		{`{"capabilities":["object:read:/o1"]}`, 422},
		{`{"capabilities":["object:read:order/"]}`, 422},
		{`{"capabilities":["object:read:order/a/b"]}`, 422},
		{`{"capabilities":["object:read:or:der/o1"]}`, 422},
		{`{"capabilities":["read:order/o1"]}`, 422},
		{`{"capabilities":["object:read:order/o1",""]}`, 422},
		{`{"capabilities":[]}`, 422},
		{`{}`, 422},
		{`{"capabilities":["object:read:order/o1"],"ttl_seconds":0}`, 422},
		{`{"capabilities":["object:read:order/o1"],"ttl_seconds":-5}`, 422},
		{`{"capabilities":["object:read:order/o1"],"ttl_seconds":86401}`, 422},
		{`{"capabilities":["object:read:order/o1"],"socket_id":""}`, 422},
		{`{"capabilities":["object:read:order/o1"],"ttl_seconds":1.5}`, 400},
		{`{"capabilities":["object:read:order/o1"],"ttl_seconds":"60"}`, 400},
		{`{"capabilities":"object:read:order/o1"}`, 400},
		{`{"capabilities":["object:read:order/o1"],"scope":"all"}`, 400},
		{`[]`, 400},
		{`nope`, 400},
	} {
		r := ts.do("POST", path, c.body, nil)
		if r.status != c.status {
			t.Errorf("mint %s: %d %s, want %d", c.body, r.status, r.body, c.status)
			continue
		}
		if m := r.json(t); m["error"] == nil || m["code"] == nil {
			t.Errorf("mint %s: body %s lacks error and code", c.body, r.body)
		}
		// Messages speak of the API, never of Go (spec/errors.md).
		if strings.Contains(string(r.body), "Go ") || strings.Contains(string(r.body), "json:") || strings.Contains(string(r.body), "mintRequest") {
			t.Errorf("mint %s: %s", c.body, r.body)
		}
	}
	body := `{"capabilities":["object:read:order/o1"]}`
	for _, hdr := range []map[string]string{
		{},
		{"X-App-Key": testApp.Key, "X-App-Secret": "wrong"},
		{"X-App-Key": otherApp.Key, "X-App-Secret": otherApp.Secret}, // another app's path
	} {
		if r := ts.do("POST", path, body, hdr); r.status != 401 {
			t.Errorf("mint with %v: %d, want 401", hdr, r.status)
		}
	}
}

func TestTokens_JoinWithTokens(t *testing.T) {
	ts := newTestServer(t, cluster.Config{})
	ts.do("PUT", "/api/v1/objects/app_test/order/o1/s", map[string]any{"value": 1}, nil)
	c := ts.dial(t)
	ref := c.join("socket", nil)
	sid := c.expectReply("socket", ref, "ok")["socket_id"].(string)
	topic := topicOf("order", "o1")

	joinOK := func(c *wsClient, topic, tok string) {
		t.Helper()
		ref := c.join(topic, map[string]any{"auth": tok})
		c.expectReply(topic, ref, "ok")
		if f := c.read(); f.Event != "snapshot" {
			t.Fatalf("%v, want the snapshot", f)
		}
		leave := c.send(ref, topic, "phx_leave", nil)
		c.expectReply(topic, leave, "ok")
		c.read() // phx_close
	}
	exact, _ := ts.mint(t, map[string]any{"capabilities": []string{"object:read:order/o1"}})
	joinOK(c, topic, exact)
	wild, _ := ts.mint(t, map[string]any{"capabilities": []string{"object:read:user/u1", "object:read:order/*"}})
	joinOK(c, topic, wild)
	joinOK(c, topicOf("order", "o2"), wild)
	bound, _ := ts.mint(t, map[string]any{"capabilities": []string{"object:read:order/o1"}, "socket_id": sid})
	joinOK(c, topic, bound)

	// Refusals.
	other := ts.dial(t)
	other.expectJoinError(topic, map[string]any{"auth": bound}, "invalid token") // bound to another socket
	c.expectJoinError(topicOf("order", "o2"), map[string]any{"auth": exact}, "forbidden: missing object:read:order/o2")
	c.expectJoinError(topicOf("user", "o1"), map[string]any{"auth": wild}, "forbidden: missing object:read:user/o1")
	c.expectJoinError(topic, map[string]any{"auth": ""}, "invalid token")
	c.expectJoinError(topic, map[string]any{"auth": "a.b.c"}, "invalid token")
	c.expectJoinError(topic, map[string]any{"auth": exact[:len(exact)-2]}, "invalid token")
	c.expectJoinError(topic, map[string]any{"auth": 42}, "invalid join parameters")

	sign := func(method jwt.SigningMethod, key any, claims tokenClaims) string {
		s, err := jwt.NewWithClaims(method, claims).SignedString(key)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	good := tokenClaims{Caps: []string{"object:read:order/o1"}, RegisteredClaims: jwt.RegisteredClaims{
		Issuer: testApp.ID, ExpiresAt: jwt.NewNumericDate(time.Now().Add(time.Minute)),
	}}
	if tok := sign(jwt.SigningMethodHS256, []byte(testApp.Secret), good); true {
		joinOK(c, topic, tok) // the reference: a hand-made token with the right claims joins
	}
	wrongKey := sign(jwt.SigningMethodHS256, []byte(otherApp.Secret), good)
	c.expectJoinError(topic, map[string]any{"auth": wrongKey}, "invalid token")
	hs512 := sign(jwt.SigningMethodHS512, []byte(testApp.Secret), good)
	c.expectJoinError(topic, map[string]any{"auth": hs512}, "invalid token")
	none := sign(jwt.SigningMethodNone, jwt.UnsafeAllowNoneSignatureType, good)
	c.expectJoinError(topic, map[string]any{"auth": none}, "invalid token")
	otherIss := good
	otherIss.Issuer = otherApp.ID
	c.expectJoinError(topic, map[string]any{"auth": sign(jwt.SigningMethodHS256, []byte(testApp.Secret), otherIss)}, "invalid token")
	noExp := good
	noExp.ExpiresAt = nil
	c.expectJoinError(topic, map[string]any{"auth": sign(jwt.SigningMethodHS256, []byte(testApp.Secret), noExp)}, "invalid token")
	expired := good
	expired.ExpiresAt = jwt.NewNumericDate(time.Now().Add(-time.Second))
	c.expectJoinError(topic, map[string]any{"auth": sign(jwt.SigningMethodHS256, []byte(testApp.Secret), expired)}, "invalid token")
	// A token for another app's object (its own key in its own topic) does not
	// work on this app's socket.
	otherTok := strings.Split(wrongKey, ".")[0]
	c.expectJoinError(topic, map[string]any{"auth": otherTok}, "invalid token")
}

func TestTokens_ExpireOnTheServerClock(t *testing.T) {
	ts := newTestServer(t, cluster.Config{})
	tok, _ := ts.mint(t, map[string]any{"capabilities": []string{"object:read:order/o1"}, "ttl_seconds": 60})
	c := ts.dial(t)
	topic := topicOf("order", "o1")
	ref := c.join(topic, map[string]any{"auth": tok})
	c.expectReply(topic, ref, "ok")
	c.read()
	later := func() time.Time { return time.Now().Add(61 * time.Second) }
	ts.gw.clock.Store(&later)
	c2 := ts.dial(t)
	c2.expectJoinError(topic, map[string]any{"auth": tok}, "invalid token")
}
