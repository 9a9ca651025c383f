package main

import (
	"fmt"
	"net/url"
	"time"

	"github.com/spf13/cobra"
)

// tokenCommand is `holdfast token`: capability tokens for browsers.
func tokenCommand() *cobra.Command {
	cmd, o := clientGroup("token", "Mint capability tokens that let a browser watch objects")
	cmd.AddCommand(tokenMint(o))
	return cmd
}

func tokenMint(o *clientOpts) *cobra.Command {
	var (
		ttl      time.Duration
		socketID string
	)
	cmd := &cobra.Command{
		Use:   "mint CAPABILITY...",
		Short: "Mint a token for the capabilities given",
		Long: `Mint a capability token and print it (its expiry goes to stderr; with --json both
are printed as {"token", "expires_at"}). A CAPABILITY is object:read:TYPE/KEY, or
object:read:TYPE/* for every key of a type. A browser joins an object's channel
with {"auth": TOKEN}.`,
		Args: usageArgs(1, -1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := o.client()
			if err != nil {
				return err
			}
			body := map[string]any{"capabilities": args}
			if cmd.Flags().Changed("ttl") {
				body["ttl_seconds"] = int64(ttl / time.Second)
			}
			if socketID != "" {
				body["socket_id"] = socketID
			}
			var r struct {
				Token     string `json:"token"`
				ExpiresAt int64  `json:"expires_at"`
			}
			b, err := c.call(cmd.Context(), "POST", "/api/v1/tokens/"+url.PathEscape(c.key), nil, body, &r)
			if err != nil || o.json {
				return orPrint(cmd.OutOrStdout(), b, err)
			}
			fmt.Fprintln(cmd.OutOrStdout(), r.Token)
			fmt.Fprintln(cmd.ErrOrStderr(), "expires", msTime(r.ExpiresAt))
			return nil
		},
	}
	cmd.Flags().DurationVar(&ttl, "ttl", 5*time.Minute, "how long the token is valid (whole seconds, at most 24h)")
	cmd.Flags().StringVar(&socketID, "socket-id", "", "accept the token only on this websocket")
	return cmd
}
