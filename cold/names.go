package cold

import (
	"encoding/base64"
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// Where a log keeps its segments: the one key layout every store holds.
//
//	log/<app>/<type>/<key>/<first offset, 20 digits>
//
// Each name is its unpadded base64url form, so that any name makes a valid key.
// A form of at most 255 bytes (a name of at most 191 bytes) is one path segment,
// as it always was: segments written before issue 26 keep their path, so a flush
// fixed by an older version and retried by this one writes or finds the same
// object, and nothing needs migrating. A longer form is cut into pieces of 200
// bytes, and every piece but the last starts with '~' ("continued in the next
// segment"), since a file system refuses path components of more than 255 bytes.
//
// Why pieces and not a hash of the name (issue 26, docs/decisions.md): the key
// stays the name itself, readable and reversible, the segments of one object or
// one type stay listable by prefix, and no store needs a second place (object
// metadata, a side file) to say which name a hash stands for.
//
// The layout is injective and prefix-exclusive: '~' is not in the base64url
// alphabet, so reading segments from the left, a name is a run of '~' segments
// ended by one plain segment; "log/<app>/<type>/<key>/" is therefore the prefix
// of that object's segments only (see parseLogSegmentKey).
//
// Lengths: a name of the spec's 256 bytes is 342 bytes of base64url, 344 in two
// pieces, so with type and key of 256 bytes a key is 715 bytes plus the app's
// form: 801 for an app id of 64 bytes, which leaves over 200 bytes for an S3
// prefix within S3's 1024 (MaxKeyLen); without a prefix any app of up to 230
// bytes fits. Only a 231-to-256-byte app id (the most ValidateID allows; the
// configuration's ids are app_ and a few characters) with long names passes it,
// up to 4 + 3·345 + 20 = 1059 bytes: such a key is refused with ErrInvalidKey,
// which fails that flush with a clear error; it is never cut. Every path segment
// is at most 255 bytes (a piece is 201), the file systems' limit.

const (
	// maxOneSegment is the longest name form kept as one path segment: the
	// file systems' limit on a path component, and the form every name of up
	// to 191 bytes had before issue 26.
	maxOneSegment = 255
	// namePiece is the length of the pieces a longer form is cut into.
	namePiece = 200
	// continued starts every piece of a name but its last.
	continued = '~'
	// logRoot is the first segment of every log segment key.
	logRoot = "log"
)

var nameEncoding = base64.RawURLEncoding

// appendName appends name's path segments to b.
func appendName(b []byte, name string) []byte {
	form := nameEncoding.EncodeToString([]byte(name))
	if len(form) <= maxOneSegment {
		return append(b, form...)
	}
	for len(form) > namePiece {
		b = append(b, continued)
		b = append(b, form[:namePiece]...)
		b = append(b, '/')
		form = form[namePiece:]
	}
	return append(b, form...)
}

// LogObjectPrefix is the prefix of every segment key of the log of (app, typ,
// key), and of no other log's: "log/<app>/<type>/<key>/".
func LogObjectPrefix(app, typ, key string) string {
	b := make([]byte, 0, 64+2*(len(app)+len(typ)+len(key)))
	b = append(b, logRoot+"/"...)
	for _, name := range []string{app, typ, key} {
		b = appendName(b, name)
		b = append(b, '/')
	}
	return string(b)
}

// LogSegmentKey is the key of the segment of the log of (app, typ, key) that
// starts at offset first.
func LogSegmentKey(app, typ, key string, first uint64) string {
	return fmt.Sprintf("%s%020d", LogObjectPrefix(app, typ, key), first)
}

var errNotSegmentKey = errors.New("not a log segment key")

// parseLogSegmentKey is LogSegmentKey's inverse (the layout's proof of
// injectivity, and an operator's way back from a key to its log).
func parseLogSegmentKey(k string) (app, typ, key string, first uint64, err error) {
	segs := strings.Split(k, "/")
	if len(segs) < 5 || segs[0] != logRoot {
		return "", "", "", 0, errNotSegmentKey
	}
	last := segs[len(segs)-1]
	if len(last) != 20 {
		return "", "", "", 0, errNotSegmentKey
	}
	if first, err = strconv.ParseUint(last, 10, 64); err != nil {
		return "", "", "", 0, errNotSegmentKey
	}
	var names []string
	var form []byte
	for _, s := range segs[1 : len(segs)-1] {
		if rest, ok := strings.CutPrefix(s, string(continued)); ok {
			if len(rest) != namePiece {
				return "", "", "", 0, errNotSegmentKey
			}
			form = append(form, rest...)
			continue
		}
		form = append(form, s...)
		b, err := nameEncoding.DecodeString(string(form))
		if err != nil {
			return "", "", "", 0, errNotSegmentKey
		}
		names, form = append(names, string(b)), form[:0]
	}
	if len(names) != 3 || len(form) != 0 {
		return "", "", "", 0, errNotSegmentKey
	}
	return names[0], names[1], names[2], first, nil
}
