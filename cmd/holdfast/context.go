package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/spf13/cobra"
)

// Saved contexts, as `nats context` keeps them: a name for a node's URL and an
// app's credentials, so that the client commands need neither flags nor
// environment variables. They live in the user's configuration directory
// (os.UserConfigDir: $XDG_CONFIG_HOME or ~/.config on Linux), in
// holdfast/contexts.json, readable by the user only (0600; the directory
// 0700), since they hold App Secrets.
//
// A client command takes each setting from, in order: its flag, the
// environment (HOLDFAST_URL, HOLDFAST_APP_KEY, HOLDFAST_APP_SECRET), the
// context --context or HOLDFAST_CONTEXT names, else the current one.

// savedContext is one context.
type savedContext struct {
	URL       string `json:"url,omitempty"`
	AppKey    string `json:"appKey,omitempty"`
	AppSecret string `json:"appSecret,omitempty"`
}

// contextFile is the file's content.
type contextFile struct {
	Current  string                  `json:"current,omitempty"`
	Contexts map[string]savedContext `json:"contexts"`
}

// contextPath is where the contexts are kept.
func contextPath() (string, error) {
	dir, err := os.UserConfigDir()
	if err != nil {
		return "", fmt.Errorf("no configuration directory for contexts: %w", err)
	}
	return filepath.Join(dir, "holdfast", "contexts.json"), nil
}

// loadContexts reads the contexts; none saved is an empty file.
func loadContexts() (*contextFile, string, error) {
	path, err := contextPath()
	if err != nil {
		return nil, "", err
	}
	f := &contextFile{Contexts: map[string]savedContext{}}
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return f, path, nil
	}
	if err != nil {
		return nil, path, err
	}
	if err := json.Unmarshal(b, f); err != nil {
		return nil, path, fmt.Errorf("%s: %w", path, err)
	}
	if f.Contexts == nil {
		f.Contexts = map[string]savedContext{}
	}
	return f, path, nil
}

// save writes the contexts, readable by the user only, through a temporary
// file renamed over the old one.
func (f *contextFile) save(path string) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return err
	}
	b, err := json.MarshalIndent(f, "", "  ")
	if err != nil {
		return err
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, append(b, '\n'), 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// chosen returns the context a client command uses: name (--context or
// HOLDFAST_CONTEXT), else the current one; ok false when there is none. A
// name that is not saved is an error.
func chosenContext(name string) (savedContext, bool, error) {
	f, path, err := loadContexts()
	if err != nil {
		return savedContext{}, false, err
	}
	if name == "" {
		name = f.Current
		if name == "" {
			return savedContext{}, false, nil
		}
	}
	c, ok := f.Contexts[name]
	if !ok {
		return savedContext{}, false, fmt.Errorf("no context %q in %s (holdfast context ls lists them)", name, path)
	}
	return c, true, nil
}

func contextCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "context",
		Short: "Save a node's URL and an app's credentials under a name, and pick the one client commands use",
		Long: `Save a node's URL and an app's credentials under a name ("holdfast context add"),
and pick the one the client commands use ("holdfast context use"). Flags and the
environment still win over a context, setting by setting; --context NAME (or
HOLDFAST_CONTEXT) picks another context for one command.

The contexts are in holdfast/contexts.json of the user's configuration
directory ($XDG_CONFIG_HOME, else ~/.config), readable by the user only.`,
	}
	var c savedContext
	var use bool
	add := &cobra.Command{
		Use:   "add NAME --url URL --app-key KEY --app-secret SECRET",
		Short: "Save (or replace) a context",
		Args:  usageArgs(1, 1),
		RunE: func(cmd *cobra.Command, args []string) error {
			f, path, err := loadContexts()
			if err != nil {
				return err
			}
			if c.URL != "" {
				if _, err := parseBaseURL(c.URL); err != nil {
					return err
				}
			}
			f.Contexts[args[0]] = c
			if use || len(f.Contexts) == 1 {
				f.Current = args[0]
			}
			if err := f.save(path); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "saved context %s%s\n", args[0], map[bool]string{true: " (current)"}[f.Current == args[0]])
			return nil
		},
	}
	add.Flags().StringVar(&c.URL, "url", "", "the node's base URL")
	add.Flags().StringVar(&c.AppKey, "app-key", "", "the App Key")
	add.Flags().StringVar(&c.AppSecret, "app-secret", "", "the App Secret")
	add.Flags().BoolVar(&use, "use", false, "make it the current context (the first one saved is)")

	useCmd := &cobra.Command{
		Use:               "use NAME",
		Short:             "Make a saved context the current one",
		Args:              usageArgs(1, 1),
		ValidArgsFunction: completeContexts,
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := changeContext(args[0], func(f *contextFile) { f.Current = args[0] }); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "using context %s\n", args[0])
			return nil
		},
	}
	ls := &cobra.Command{
		Use:   "ls",
		Short: "List the saved contexts (the current one marked *), without their secrets",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			f, _, err := loadContexts()
			if err != nil {
				return err
			}
			for _, name := range slices.Sorted(maps.Keys(f.Contexts)) {
				mark := " "
				if name == f.Current {
					mark = "*"
				}
				c := f.Contexts[name]
				fmt.Fprintf(cmd.OutOrStdout(), "%s %s %s %s\n", mark, name, orNone(c.URL), orNone(c.AppKey))
			}
			return nil
		},
	}
	rm := &cobra.Command{
		Use:               "rm NAME",
		Short:             "Delete a saved context",
		Args:              usageArgs(1, 1),
		ValidArgsFunction: completeContexts,
		RunE: func(cmd *cobra.Command, args []string) error {
			err := changeContext(args[0], func(f *contextFile) {
				delete(f.Contexts, args[0])
				if f.Current == args[0] {
					f.Current = ""
				}
			})
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "deleted context %s\n", args[0])
			return nil
		},
	}
	cmd.AddCommand(add, useCmd, ls, rm)
	return cmd
}

// changeContext applies change to the saved contexts and saves them, if
// context name exists.
func changeContext(name string, change func(*contextFile)) error {
	f, path, err := loadContexts()
	if err != nil {
		return err
	}
	if _, ok := f.Contexts[name]; !ok {
		return fmt.Errorf("no context %q (holdfast context ls lists them)", name)
	}
	change(f)
	return f.save(path)
}

// completeContexts completes a saved context's name.
func completeContexts(_ *cobra.Command, _ []string, prefix string) ([]string, cobra.ShellCompDirective) {
	f, _, err := loadContexts()
	if err != nil {
		return nil, cobra.ShellCompDirectiveError
	}
	var out []string
	for name := range f.Contexts {
		if strings.HasPrefix(name, prefix) {
			out = append(out, name)
		}
	}
	slices.Sort(out)
	return out, cobra.ShellCompDirectiveNoFileComp
}
