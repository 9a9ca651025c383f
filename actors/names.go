package actors

import (
	"strings"
	"unicode/utf8"

	"github.com/holdfast/holdfast/persistence"
)

// ObjectID names a durable object (app, type, key).
type ObjectID = persistence.ObjectID

// MaxNameBytes bounds an object's type and key and a slot's name.
const MaxNameBytes = 256

// ValidateID checks an object name against spec/README.md: type and key are
// non-empty UTF-8 of at most 256 bytes; type holds no ':' or '/'; key holds no '/'.
func ValidateID(id ObjectID) error {
	if id.App == "" || len(id.App) > MaxNameBytes {
		return badRequestf("app must be 1 to %d bytes", MaxNameBytes)
	}
	if err := checkName("type", id.Type, ":/"); err != nil {
		return err
	}
	return checkName("key", id.Key, "/")
}

func checkName(what, s, forbidden string) error {
	switch {
	case s == "":
		return badRequestf("%s must not be empty", what)
	case len(s) > MaxNameBytes:
		return badRequestf("%s is %d bytes, at most %d", what, len(s), MaxNameBytes)
	case !utf8.ValidString(s):
		return badRequestf("%s is not valid UTF-8", what)
	case strings.ContainsAny(s, forbidden):
		return badRequestf("%s must not contain %s", what, quoteChars(forbidden))
	}
	return nil
}

func quoteChars(s string) string {
	parts := make([]string, 0, len(s))
	for _, r := range s {
		parts = append(parts, "'"+string(r)+"'")
	}
	return strings.Join(parts, " or ")
}

// checkUserName is the one rule of the names a client gives inside an object:
// slot names, alarm names, log consumer names and queue message ids, in a path
// or in a body. Bytes that are not UTF-8 are malformed input (400), as they are
// in a JSON body; an empty name, one over max bytes, or one holding a byte of
// forbidden is a well-formed request that is refused (422).
func checkUserName(what, s string, max int, forbidden string) *Error {
	switch {
	case !utf8.ValidString(s):
		return badRequestf("%s is not valid UTF-8", what)
	case s == "":
		return invalidf("%s must not be empty", what)
	case len(s) > max:
		return invalidf("%s is %d bytes, at most %d", what, len(s), max)
	case strings.ContainsAny(s, forbidden):
		return invalidf("%s must not contain %s", what, quoteChars(forbidden))
	}
	return nil
}

// reservedSlots are route names under an object and cannot be slots.
var reservedSlots = map[string]bool{"log": true, "transaction": true}

// validateSlot checks a slot name (spec/objects.md) on every route that names
// one: checkUserName's rule (at most 256 bytes, no '/'), and not reserved (422).
func validateSlot(s string) error {
	if err := checkUserName("slot name", s, MaxNameBytes, "/"); err != nil {
		return err
	}
	if reservedSlots[s] {
		return invalidf("slot name %q is reserved", s)
	}
	return nil
}
