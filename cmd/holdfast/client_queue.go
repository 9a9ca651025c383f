package main

import (
	"encoding/json"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	hfclient "github.com/holdfast/holdfast/client"
)

// queueCommand is `holdfast queue`: an object's write-ahead queue.
func queueCommand() *cobra.Command {
	cmd, o := clientGroup("queue", "Send, receive and settle messages of an object's queue (TYPE/KEY)")
	cmd.AddCommand(queueSend(o), queueReceive(o), queueAck(o), queueNack(o), queueDeadLetters(o), queueRedrive(o),
		queueDeadLetterDelete(o), queueStats(o), listCommand(o, hfclient.ListQueues, "objects that hold a queue"))
	completeObjects(cmd, o, hfclient.ListQueues)
	return cmd
}

func queueSend(o *clientOpts) *cobra.Command {
	var (
		ids   []string
		topic string
		delay time.Duration
	)
	cmd := &cobra.Command{
		Use:   "send TYPE/KEY PAYLOAD...",
		Short: "Enqueue messages (each PAYLOAD is JSON) in one batch",
		Long: `Enqueue one message per PAYLOAD argument, atomically, and print their ids. Each
PAYLOAD is JSON (a string in JSON quotes). --id, repeated, names the messages in
order (an id the queue still holds is not enqueued twice); the others get
generated ids.`,
		Args: usageArgs(2, -1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, ref, err := o.object(args[0])
			if err != nil {
				return err
			}
			if len(ids) > len(args)-1 {
				return fmt.Errorf("%d --id for %d messages", len(ids), len(args)-1)
			}
			msgs := make([]map[string]any, len(args)-1)
			for i, a := range args[1:] {
				p, err := parseJSONArg("PAYLOAD", a)
				if err != nil {
					return err
				}
				msgs[i] = map[string]any{"payload": p}
				if i < len(ids) {
					msgs[i]["id"] = ids[i]
				}
				if topic != "" {
					msgs[i]["topic"] = topic
				}
				if delay > 0 {
					msgs[i]["delayMs"] = delay.Milliseconds()
				}
			}
			var r struct {
				IDs []string `json:"ids"`
			}
			b, err := c.call(cmd.Context(), "POST", c.path("queues", ref, "messages"), nil, map[string]any{"messages": msgs}, &r)
			if err != nil || o.json {
				return orPrint(cmd.OutOrStdout(), b, err)
			}
			fmt.Fprintln(cmd.OutOrStdout(), "ids", strings.Join(r.IDs, " "))
			return nil
		},
	}
	f := cmd.Flags()
	f.StringArrayVar(&ids, "id", nil, "id of the next message (repeat, in order)")
	f.StringVar(&topic, "topic", "", "the messages' topic (default: default)")
	f.DurationVar(&delay, "delay", 0, "deliver no sooner than this from now")
	return cmd
}

func queueReceive(o *clientOpts) *cobra.Command {
	var (
		maxN             int
		wait, visibility time.Duration
		target, topic    string
	)
	cmd := &cobra.Command{
		Use:   "receive TYPE/KEY",
		Short: "Receive due messages, each with a receipt to settle it",
		Long: `Receive up to --max due messages of one target and print one line each:
"ID TOPIC attempt N receipt RECEIPT PAYLOAD". Settle each with "queue ack" or
"queue nack" before its visibility deadline. --wait long-polls (at most 20s)
until a message is due.`,
		Args: usageArgs(1, 1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, ref, err := o.object(args[0])
			if err != nil {
				return err
			}
			body := map[string]any{}
			f := cmd.Flags()
			body["max"] = maxN
			if f.Changed("wait") {
				body["waitMs"] = wait.Milliseconds()
			}
			if f.Changed("visibility") {
				body["visibilityMs"] = visibility.Milliseconds()
			}
			if target != "" {
				body["target"] = target
			}
			if topic != "" {
				body["topic"] = topic
			}
			var r struct {
				Messages []struct {
					ID      string          `json:"id"`
					Topic   string          `json:"topic"`
					Payload json.RawMessage `json:"payload"`
					Attempt int             `json:"attempt"`
					Receipt string          `json:"receipt"`
				} `json:"messages"`
			}
			b, err := c.call(cmd.Context(), "POST", c.path("queues", ref, "receive"), nil, body, &r)
			if err != nil || o.json {
				return orPrint(cmd.OutOrStdout(), b, err)
			}
			if len(r.Messages) == 0 {
				fmt.Fprintln(cmd.OutOrStdout(), "no message is due")
			}
			for _, m := range r.Messages {
				fmt.Fprintf(cmd.OutOrStdout(), "%s %s attempt %d receipt %s %s\n", m.ID, m.Topic, m.Attempt, m.Receipt, compact(m.Payload))
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.IntVar(&maxN, "max", 10, "at most this many messages")
	f.DurationVar(&wait, "wait", 0, "wait this long for a message to be due (at most 20s)")
	f.DurationVar(&visibility, "visibility", 0, "visibility timeout (default: the type's)")
	f.StringVar(&target, "target", "", "the target to receive for (default: default)")
	f.StringVar(&topic, "topic", "", "only messages of this topic")
	return cmd
}

func queueAck(o *clientOpts) *cobra.Command {
	return &cobra.Command{
		Use:   "ack TYPE/KEY RECEIPT...",
		Short: "Ack received messages: they are complete",
		Long: `Ack the messages whose receipts are given and print "acked N". A receipt that is
no longer held (expired and redelivered, or settled) gets HTTP 409; the others are
still acked.`,
		Args: usageArgs(2, -1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, ref, err := o.object(args[0])
			if err != nil {
				return err
			}
			var r struct {
				Acked int `json:"acked"`
			}
			b, err := c.call(cmd.Context(), "POST", c.path("queues", ref, "ack"), nil, map[string]any{"receipts": args[1:]}, &r)
			if err != nil || o.json {
				return orPrint(cmd.OutOrStdout(), b, err)
			}
			fmt.Fprintln(cmd.OutOrStdout(), "acked", r.Acked)
			return nil
		},
	}
}

func queueNack(o *clientOpts) *cobra.Command {
	var (
		delay   time.Duration
		message string
		dead    bool
	)
	cmd := &cobra.Command{
		Use:   "nack TYPE/KEY RECEIPT",
		Short: "Nack a received message: retry it later, or dead-letter it",
		Long: `Nack a received message and print its state: "pending" (retried after the
backoff, or --delay) or "failed" (its last attempt: in the dead letters). With
--dead it goes to the dead letters at once (--error is then the reason).`,
		Args: usageArgs(2, 2),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, ref, err := o.object(args[0])
			if err != nil {
				return err
			}
			if dead {
				body := map[string]any{"receipt": args[1]}
				if message != "" {
					body["reason"] = message
				}
				b, err := c.call(cmd.Context(), "POST", c.path("queues", ref, "dead"), nil, body, nil)
				if err != nil || o.json {
					return orPrint(cmd.OutOrStdout(), b, err)
				}
				fmt.Fprintln(cmd.OutOrStdout(), "failed")
				return nil
			}
			body := map[string]any{"receipt": args[1]}
			if cmd.Flags().Changed("delay") {
				body["delayMs"] = delay.Milliseconds()
			}
			if message != "" {
				body["error"] = message
			}
			var r struct {
				State string `json:"state"`
			}
			b, err := c.call(cmd.Context(), "POST", c.path("queues", ref, "nack"), nil, body, &r)
			if err != nil || o.json {
				return orPrint(cmd.OutOrStdout(), b, err)
			}
			fmt.Fprintln(cmd.OutOrStdout(), r.State)
			return nil
		},
	}
	f := cmd.Flags()
	f.DurationVar(&delay, "delay", 0, "retry no sooner than this (default: the backoff)")
	f.StringVar(&message, "error", "", "the error to record")
	f.BoolVar(&dead, "dead", false, "dead-letter the message now")
	return cmd
}

func queueDeadLetters(o *clientOpts) *cobra.Command {
	var (
		limit         int
		target, topic string
	)
	cmd := &cobra.Command{
		Use:   "dead-letters TYPE/KEY",
		Short: "List the queue's dead letters",
		Long: `List the dead letters, one line each: "ID TARGET TOPIC attempts N REASON: LAST_ERROR
PAYLOAD". Redrive them with "queue redrive".`,
		Args: usageArgs(1, 1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, ref, err := o.object(args[0])
			if err != nil {
				return err
			}
			q := url.Values{}
			if cmd.Flags().Changed("limit") {
				q.Set("limit", strconv.Itoa(limit))
			}
			if target != "" {
				q.Set("target", target)
			}
			if topic != "" {
				q.Set("topic", topic)
			}
			var r struct {
				DeadLetters []hfclient.DeadLetter `json:"deadLetters"`
			}
			b, err := c.call(cmd.Context(), "GET", c.path("queues", ref, "dead-letters"), q, nil, &r)
			if err != nil || o.json {
				return orPrint(cmd.OutOrStdout(), b, err)
			}
			for _, d := range r.DeadLetters {
				fmt.Fprintf(cmd.OutOrStdout(), "%s %s %s attempts %d %s: %s %s\n", d.ID, d.Target, d.Topic, d.Attempts, d.Reason, d.LastError, compact(d.Payload))
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.IntVar(&limit, "limit", 100, "at most this many (at most 1000)")
	f.StringVar(&target, "target", "", "only this target's")
	f.StringVar(&topic, "topic", "", "only this topic's")
	return cmd
}

func queueRedrive(o *clientOpts) *cobra.Command {
	return &cobra.Command{
		Use:   "redrive TYPE/KEY [ID...]",
		Short: "Put dead letters back to pending (all of them, or the IDs given)",
		Args:  usageArgs(1, -1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, ref, err := o.object(args[0])
			if err != nil {
				return err
			}
			var body any
			if len(args) > 1 {
				body = map[string]any{"ids": args[1:]}
			}
			var r struct {
				Redriven int `json:"redriven"`
			}
			b, err := c.call(cmd.Context(), "POST", c.path("queues", ref, "dead-letters", "redrive"), nil, body, &r)
			if err != nil || o.json {
				return orPrint(cmd.OutOrStdout(), b, err)
			}
			fmt.Fprintln(cmd.OutOrStdout(), "redriven", r.Redriven)
			return nil
		},
	}
}

func queueStats(o *clientOpts) *cobra.Command {
	return &cobra.Command{
		Use:   "stats TYPE/KEY",
		Short: "Count the queue's messages by state",
		Args:  usageArgs(1, 1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, ref, err := o.object(args[0])
			if err != nil {
				return err
			}
			var r map[string]json.RawMessage
			b, err := c.call(cmd.Context(), "GET", c.path("queues", ref, "stats"), nil, nil, &r)
			if err != nil || o.json {
				return orPrint(cmd.OutOrStdout(), b, err)
			}
			for _, k := range []string{"pending", "delayed", "processing", "complete", "failed"} {
				fmt.Fprintf(cmd.OutOrStdout(), "%s %s\n", k, r[k])
			}
			return nil
		},
	}
}

func queueDeadLetterDelete(o *clientOpts) *cobra.Command {
	return &cobra.Command{
		Use:   "dead-letter-delete TYPE/KEY ID...",
		Short: "Delete dead letters for good (the message too, once no target holds it)",
		Args:  usageArgs(2, -1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, ref, err := o.object(args[0])
			if err != nil {
				return err
			}
			for _, id := range args[1:] {
				if _, err := c.call(cmd.Context(), "DELETE", c.path("queues", ref, "dead-letters", id), nil, nil, nil); err != nil {
					return fmt.Errorf("dead letter %s: %w", id, err)
				}
				fmt.Fprintf(cmd.OutOrStdout(), "deleted %s\n", id)
			}
			return nil
		},
	}
}
