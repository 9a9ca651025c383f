// Package jsonvalid checks JSON text exactly as encoding/json.Valid does, several
// times faster: a plain recursive descent instead of encoding/json's scanner,
// which calls a state function for every byte.
//
// The grammar is encoding/json's: RFC 8259 values with space, tab, CR and LF as
// whitespace, strings that may hold any byte from 0x20 up (UTF-8 is not checked,
// as encoding/json does not), and arrays and objects nested at most 10,000 deep.
// FuzzValid compares the two on arbitrary input.
package jsonvalid

// maxDepth is encoding/json's maxNestingDepth.
const maxDepth = 10000

// Valid reports whether b is one JSON value, with optional whitespace around it.
func Valid(b []byte) bool {
	i, ok := value(b, space(b, 0), 0)
	return ok && space(b, i) == len(b)
}

// space returns the index of the first byte at or after i that is not whitespace.
func space(b []byte, i int) int {
	for i < len(b) {
		switch b[i] {
		case ' ', '\t', '\n', '\r':
			i++
		default:
			return i
		}
	}
	return i
}

// value checks the value that starts at b[i] (no whitespace before it), inside
// depth open arrays and objects, and returns the index after it.
func value(b []byte, i, depth int) (int, bool) {
	if i >= len(b) {
		return i, false
	}
	switch c := b[i]; {
	case c == '"':
		return str(b, i)
	case c == '{':
		return object(b, i, depth+1)
	case c == '[':
		return array(b, i, depth+1)
	case c == '-' || c >= '0' && c <= '9':
		return number(b, i)
	case c == 't':
		return literal(b, i, "true")
	case c == 'f':
		return literal(b, i, "false")
	case c == 'n':
		return literal(b, i, "null")
	}
	return i, false
}

func literal(b []byte, i int, word string) (int, bool) {
	if len(b)-i < len(word) || string(b[i:i+len(word)]) != word {
		return i, false
	}
	return i + len(word), true
}

// plain marks the bytes a string holds as they are: not '"', not '\\', not a
// control byte.
var plain = func() (t [256]bool) {
	for c := 0x20; c < 256; c++ {
		t[c] = c != '"' && c != '\\'
	}
	return t
}()

// str checks the string that starts at b[i] == '"'.
func str(b []byte, i int) (int, bool) {
	i++
	for i < len(b) {
		for i < len(b) && plain[b[i]] {
			i++
		}
		if i >= len(b) {
			break
		}
		c := b[i]
		switch {
		case c == '"':
			return i + 1, true
		case c == '\\':
			if i+1 >= len(b) {
				return i, false
			}
			switch b[i+1] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				i += 2
			case 'u':
				if len(b)-i < 6 || !hex(b[i+2]) || !hex(b[i+3]) || !hex(b[i+4]) || !hex(b[i+5]) {
					return i, false
				}
				i += 6
			default:
				return i, false
			}
		case c < 0x20:
			return i, false
		default:
			i++
		}
	}
	return i, false
}

func hex(c byte) bool {
	return c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F'
}

// number checks the number that starts at b[i].
func number(b []byte, i int) (int, bool) {
	if b[i] == '-' {
		i++
	}
	switch {
	case i >= len(b):
		return i, false
	case b[i] == '0':
		i++
	case b[i] >= '1' && b[i] <= '9':
		i = digits(b, i+1)
	default:
		return i, false
	}
	if i < len(b) && b[i] == '.' {
		j := digits(b, i+1)
		if j == i+1 {
			return i, false
		}
		i = j
	}
	if i < len(b) && (b[i] == 'e' || b[i] == 'E') {
		i++
		if i < len(b) && (b[i] == '+' || b[i] == '-') {
			i++
		}
		j := digits(b, i)
		if j == i {
			return i, false
		}
		i = j
	}
	return i, true
}

func digits(b []byte, i int) int {
	for i < len(b) && b[i] >= '0' && b[i] <= '9' {
		i++
	}
	return i
}

// array checks the array that starts at b[i] == '[', at nesting depth.
func array(b []byte, i, depth int) (int, bool) {
	if depth > maxDepth {
		return i, false
	}
	i = space(b, i+1)
	if i < len(b) && b[i] == ']' {
		return i + 1, true
	}
	for {
		var ok bool
		if i, ok = value(b, i, depth); !ok {
			return i, false
		}
		var done bool
		if i, done, ok = next(b, i, ']'); done || !ok {
			return i, ok
		}
	}
}

// object checks the object that starts at b[i] == '{', at nesting depth.
func object(b []byte, i, depth int) (int, bool) {
	if depth > maxDepth {
		return i, false
	}
	i = space(b, i+1)
	if i < len(b) && b[i] == '}' {
		return i + 1, true
	}
	for {
		if i >= len(b) || b[i] != '"' {
			return i, false
		}
		var ok bool
		if i, ok = str(b, i); !ok {
			return i, false
		}
		i = space(b, i)
		if i >= len(b) || b[i] != ':' {
			return i, false
		}
		if i, ok = value(b, space(b, i+1), depth); !ok {
			return i, false
		}
		var done bool
		if i, done, ok = next(b, i, '}'); done || !ok {
			return i, ok
		}
	}
}

// next reads what follows an element of an array or object: a comma (the
// next element starts at the returned index) or closer (done).
func next(b []byte, i int, closer byte) (int, bool, bool) {
	i = space(b, i)
	switch {
	case i >= len(b):
		return i, false, false
	case b[i] == ',':
		return space(b, i+1), false, true
	case b[i] == closer:
		return i + 1, true, true
	}
	return i, false, false
}
