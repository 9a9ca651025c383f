package config

import (
	"fmt"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"
)

// TestDoc_ConfigurationReference: docs/configuration.md names exactly the keys
// the parser accepts, and states the defaults the parser applies to every
// per-type key.
func TestDoc_ConfigurationReference(t *testing.T) {
	b, err := os.ReadFile("../docs/configuration.md")
	if err != nil {
		t.Fatal(err)
	}
	row := regexp.MustCompile("(?m)^\\| `([^`]+)` \\|([^|]*)\\|([^|]*)\\|")
	documented := map[string]string{} // key -> default column (or the third column)
	for _, m := range row.FindAllStringSubmatch(string(b), -1) {
		documented[m[1]] = strings.TrimSpace(m[3])
	}
	want := map[string]bool{}
	for k := range topKeys {
		want[k] = true
	}
	for k := range appKeys {
		want["apps[]."+k] = true
	}
	for k := range leaves {
		want["types.<name>."+k] = true
	}
	for k := range want {
		if _, ok := documented[k]; !ok {
			t.Errorf("docs/configuration.md does not document %s", k)
		}
	}
	for k := range documented {
		if !want[k] {
			t.Errorf("docs/configuration.md documents %s, which the parser does not accept", k)
		}
	}
	// The per-type defaults are the parser's (trimEvery's applies once a limit is set).
	path := writeConfig(t, "types: {limited: {log: {retention: {maxAge: 1h}}}}\n")
	c, err := Load(path, func(string) string { return "" })
	if err != nil {
		t.Fatal(err)
	}
	typ := c.Type("limited")
	for k, l := range leaves {
		if l.kind == kindSection || l.kind == kindSwitch {
			continue
		}
		got := documented["types.<name>."+k]
		var def any = l.def
		if k == "log.retention.trimEvery" {
			def = typ.Log.Retention.TrimEvery // resolved in Type
		}
		if w := docValue(def); got != "`"+w+"`" {
			t.Errorf("types.<name>.%s: documented default %s, the parser's is %s", k, got, w)
		}
	}
}

// docValue writes a default the way the reference does.
func docValue(v any) string {
	switch x := v.(type) {
	case time.Duration:
		switch {
		case x == 0:
			return "0s"
		case x%time.Hour == 0:
			return fmt.Sprintf("%dh", x/time.Hour)
		case x%time.Minute == 0:
			return fmt.Sprintf("%dm", x/time.Minute)
		}
		return x.String()
	case []string:
		return "[" + strings.Join(x, ", ") + "]"
	case float64:
		return fmt.Sprint(x)
	}
	return fmt.Sprint(v)
}
