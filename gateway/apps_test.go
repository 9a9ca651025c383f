package gateway

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestLoadOrCreateApps_FirstStartCreatesOneAppOnce(t *testing.T) {
	dir := t.TempDir()
	var printed []App
	apps, err := LoadOrCreateApps(dir, nil, func(a App) { printed = append(printed, a) })
	if err != nil {
		t.Fatal(err)
	}
	if len(apps) != 1 || len(printed) != 1 || apps[0] != printed[0] {
		t.Fatalf("apps %v, printed %v", apps, printed)
	}
	a := apps[0]
	if !strings.HasPrefix(a.ID, "app_") || !strings.HasPrefix(a.Key, "pk_") || !strings.HasPrefix(a.Secret, "sk_") || len(a.Secret) < 40 {
		t.Fatalf("created app %+v", a)
	}
	st, err := os.Stat(filepath.Join(dir, "apps.json"))
	if err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("apps.json: %v %v, want mode 0600", st, err)
	}
	// The second start loads it and prints nothing.
	again, err := LoadOrCreateApps(dir, nil, func(App) { t.Fatal("printed again") })
	if err != nil || len(again) != 1 || again[0] != a {
		t.Fatalf("second start: %v %v", again, err)
	}
	// Configured apps win and the file is left alone.
	conf := []App{testApp}
	got, err := LoadOrCreateApps(dir, conf, nil)
	if err != nil || len(got) != 1 || got[0] != testApp {
		t.Fatalf("configured: %v %v", got, err)
	}
}

func TestApps_Authenticate(t *testing.T) {
	apps := NewApps([]App{testApp, otherApp})
	if a, ok := apps.Authenticate(testApp.Key, testApp.Secret); !ok || a.ID != testApp.ID {
		t.Fatal("right key and secret refused")
	}
	for _, c := range [][2]string{{testApp.Key, otherApp.Secret}, {testApp.Key, ""}, {"pk_none", testApp.Secret}, {"", ""}, {testApp.ID, testApp.Secret}} {
		if _, ok := apps.Authenticate(c[0], c[1]); ok {
			t.Fatalf("authenticated %q/%q", c[0], c[1])
		}
	}
}
