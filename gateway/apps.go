package gateway

import (
	"crypto/rand"
	"crypto/subtle"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
)

// App is one tenant: every object belongs to one app.
type App struct {
	ID     string `json:"id"`
	Key    string `json:"key"`
	Secret string `json:"secret"`
}

// Apps authenticates requests. It is read-only after NewApps.
type Apps struct {
	byKey map[string]*App
	byID  map[string]*App
}

// NewApps returns a registry of apps.
func NewApps(apps []App) *Apps {
	a := &Apps{byKey: map[string]*App{}, byID: map[string]*App{}}
	for i := range apps {
		app := apps[i]
		a.byKey[app.Key] = &app
		a.byID[app.ID] = &app
	}
	return a
}

// Authenticate returns the app whose key and secret these are. The secret is
// compared in constant time.
func (a *Apps) Authenticate(key, secret string) (*App, bool) {
	app, ok := a.byKey[key]
	if !ok || secret == "" {
		return nil, false
	}
	if subtle.ConstantTimeCompare([]byte(app.Secret), []byte(secret)) != 1 {
		return nil, false
	}
	return app, true
}

// ByKey returns the app with public key key.
func (a *Apps) ByKey(key string) (*App, bool) {
	app, ok := a.byKey[key]
	return app, ok
}

// appsFile is where a data directory keeps the app created on first start.
const appsFile = "apps.json"

// AppsFile is the file of dataDir that keeps its apps when the configuration
// lists none.
func AppsFile(dataDir string) string { return filepath.Join(dataDir, appsFile) }

// LoadApps returns the apps a node serves: configured if it is not empty,
// else the apps stored in dataDir (fromFile). With neither, it returns one new
// app (created) for a new user to call the API at once; the caller saves it
// with SaveApps once the node has started, so that a start that fails leaves
// no app behind.
func LoadApps(dataDir string, configured []App) (apps []App, fromFile bool, created *App, err error) {
	if len(configured) > 0 {
		return configured, false, nil, nil
	}
	path := AppsFile(dataDir)
	b, err := os.ReadFile(path)
	if err == nil {
		if err := json.Unmarshal(b, &apps); err != nil || len(apps) == 0 {
			return nil, false, nil, fmt.Errorf("read %s: not a list of apps", path)
		}
		return apps, true, nil, nil
	}
	if !errors.Is(err, fs.ErrNotExist) {
		return nil, false, nil, fmt.Errorf("read %s: %w", path, err)
	}
	app := App{ID: "app_" + randomHex(8), Key: "pk_" + randomHex(12), Secret: "sk_" + randomHex(24)}
	return []App{app}, false, &app, nil
}

// SaveApps writes apps to dataDir's apps file, durably and readable by this
// user only.
func SaveApps(dataDir string, apps []App) error {
	if err := os.MkdirAll(dataDir, 0o755); err != nil {
		return fmt.Errorf("create data directory: %w", err)
	}
	b, _ := json.MarshalIndent(apps, "", "  ")
	if err := writeFileSync(AppsFile(dataDir), b); err != nil {
		return fmt.Errorf("write %s: %w", AppsFile(dataDir), err)
	}
	return nil
}

// LoadOrCreateApps is LoadApps that saves a new app at once and reports it
// through created (embedded uses, such as the examples).
func LoadOrCreateApps(dataDir string, configured []App, created func(App)) ([]App, error) {
	apps, _, app, err := LoadApps(dataDir, configured)
	if err != nil || app == nil {
		return apps, err
	}
	if err := SaveApps(dataDir, apps); err != nil {
		return nil, err
	}
	if created != nil {
		created(*app)
	}
	return apps, nil
}

// writeFileSync writes b to path durably: a temporary file, fsync, rename, and an
// fsync of the directory.
func writeFileSync(path string, b []byte) error {
	tmp := path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	if _, err := f.Write(b); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		return err
	}
	d, err := os.Open(filepath.Dir(path))
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

func randomHex(n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		panic(err) // crypto/rand does not fail on Linux
	}
	return hex.EncodeToString(b)
}
