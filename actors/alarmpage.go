package actors

import (
	"bytes"
	"encoding/base64"
	"encoding/binary"
	"unicode/utf8"
)

// Paging of an object's alarm list (AlarmListGet). A cursor names the last
// alarm of a page by its position in the list's order, (At, Name): the next
// page starts after it, whether or not that alarm still exists.

// alarmCursor is a position in (At, Name) order.
type alarmCursor struct {
	at   int64
	name string
}

// String encodes c as the opaque cursor clients pass back: base64url (no
// padding) of At as 8 big-endian bytes, then the name.
func (c alarmCursor) String() string {
	b := binary.BigEndian.AppendUint64(make([]byte, 0, 8+len(c.name)), uint64(c.at))
	return base64.RawURLEncoding.EncodeToString(append(b, c.name...))
}

// before reports whether c comes before the alarm (at, name) in list order.
func (c alarmCursor) before(at int64, name string) bool {
	if c.at != at {
		return c.at < at
	}
	return c.name < name
}

// maxAlarmCursor bounds an encoded cursor: 8 bytes of time and a longest name.
var maxAlarmCursor = base64.RawURLEncoding.EncodedLen(8 + MaxAlarmName)

func parseAlarmCursor(s string) (alarmCursor, error) {
	bad := badRequestf("after must be the \"next\" cursor of an earlier page of this list")
	if len(s) > maxAlarmCursor {
		return alarmCursor{}, bad
	}
	b, err := base64.RawURLEncoding.DecodeString(s)
	if err != nil || len(b) < 8 {
		return alarmCursor{}, bad
	}
	at := binary.BigEndian.Uint64(b)
	if at > maxAlarmTime {
		return alarmCursor{}, bad
	}
	return alarmCursor{at: int64(at), name: string(b[8:])}, nil
}

// alarmJSONSize estimates, from above, the bytes of a's JSON in a list reply:
// its strings with encoding/json's escapes, its action as stored (compact
// JSON, whose '<', '>' and '&' encoding/json escapes to six bytes each), and a
// fixed allowance for field names and numbers.
func alarmJSONSize(a *AlarmInfo) int {
	n := 256 + jsonStringSize(a.Name) + jsonStringSize(a.LastError) + len(a.IdempotencyKey) + len(a.Status)
	if a.Action != nil {
		n += len(a.Action) + 5*(bytes.Count(a.Action, []byte("<"))+bytes.Count(a.Action, []byte(">"))+bytes.Count(a.Action, []byte("&")))
	}
	return n
}

// jsonStringSize is the length of s as encoding/json writes it, quotes included.
func jsonStringSize(s string) int {
	n := 2
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			switch {
			case c == '"' || c == '\\' || c == '\n' || c == '\r' || c == '\t' || c == '\b' || c == '\f':
				n += 2
			case c < 0x20 || c == '<' || c == '>' || c == '&':
				n += 6
			default:
				n++
			}
			i++
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && size == 1:
			n += 6 // \ufffd
		case r == '\u2028' || r == '\u2029':
			n += 6
		default:
			n += size
		}
		i += size
	}
	return n
}
