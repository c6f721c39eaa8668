package main

import (
	"bytes"
	"fmt"
	"go/doc/comment"
	"io"
	"regexp"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/hopper-sidecar/hopper/config"
)

// newExplainCmd describes config keys from the binary, one at a time, as
// `kubectl explain` does for the fields of a resource: the same entries as
// docs/configuration.md, made from the same source.
func newExplainCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "explain [key]",
		Short: "Describe a config key: its type, default, environment variable, flag and meaning",
		Long: `Prints the reference entry of one config key: its path, type, default,
HOPPER_* variable, flag and description, the text of docs/configuration.md.
A section (retry) or a list of objects (retry.policies) also lists its keys;
without a key, the top-level keys are listed.

The key is its dotted path in the file (retry.maxAttempts); the keys of a
list's items are written with or without [] (retry.policies[].name or
retry.policies.name). A HOPPER_* variable names its key too. An unknown key
is a usage error (exit 64) that names the nearest keys.`,
		Example: `  hopper config explain retry.maxAttempts
  hopper config explain retry
  hopper config explain HOPPER_APP_URL`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ref := config.Reference()
			if len(args) == 0 {
				return writeKeys(cmd.OutOrStdout(), "", config.TopLevel(ref))
			}
			key, children, ok := config.LookupKey(ref, args[0])
			if !ok {
				msg := fmt.Sprintf("unknown config key %q", args[0])
				if s := config.SuggestKeys(ref, args[0], 5); len(s) > 0 {
					msg += "\n\nDid you mean this?\n\t" + strings.Join(s, "\n\t")
				}
				return usage(fmt.Errorf("%s\n\nRun '%s' to list the sections", msg, cmd.CommandPath()))
			}
			return writeExplain(cmd.OutOrStdout(), key, children)
		},
	}
}

// writeExplain prints one key's entry: the facts the reference lists for
// it, its description, and the keys it holds.
func writeExplain(w io.Writer, k config.KeyDoc, children []config.KeyDoc) error {
	var b bytes.Buffer
	tw := tabwriter.NewWriter(&b, 0, 4, 1, ' ', 0)
	fmt.Fprintf(tw, "KEY:\t%s\n", k.Path)
	fmt.Fprintf(tw, "TYPE:\t%s\n", k.Type)
	switch {
	case k.Required:
		fmt.Fprintf(tw, "DEFAULT:\tnone, required\n")
	case k.Default != "":
		fmt.Fprintf(tw, "DEFAULT:\t%s\n", k.Default)
	}
	switch {
	case k.Env != "":
		fmt.Fprintf(tw, "ENV:\t%s\n", k.Env)
	case k.List && !k.InItem:
		fmt.Fprintf(tw, "ENV:\tnone, set in the file only\n")
	}
	if k.Flag != "" {
		fmt.Fprintf(tw, "FLAG:\t%s\n", k.Flag)
	}
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("write: %w", err)
	}
	b.WriteString("\nDESCRIPTION:\n")
	b.WriteString(DescriptionText(k))
	if k.SameAs != "" {
		fmt.Fprintf(&b, "\n    Its keys are those of %s.\n", k.SameAs)
	}
	if _, err := w.Write(b.Bytes()); err != nil {
		return fmt.Errorf("write: %w", err)
	}
	if len(children) == 0 {
		return nil
	}
	fmt.Fprintln(w)
	return writeKeys(w, k.Path, children)
}

// writeKeys lists keys with their types and defaults, and how to see one.
func writeKeys(w io.Writer, parent string, keys []config.KeyDoc) error {
	var b bytes.Buffer
	b.WriteString("KEYS:\n")
	tw := tabwriter.NewWriter(&b, 0, 4, 3, ' ', 0)
	for _, k := range keys {
		def := k.Default
		if k.Required {
			def = "required"
		}
		fmt.Fprintf(tw, "    %s\t%s\t%s\n", k.Name, k.Type, def)
	}
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("write: %w", err)
	}
	one := "<key>"
	if parent != "" {
		one = strings.TrimSuffix(parent, "[]") + ".<key>"
	}
	fmt.Fprintf(&b, "\nRun 'hopper config explain %s' for one of them; every key is in docs/configuration.md.\n", one)
	if _, err := w.Write(trailingSpace.ReplaceAll(b.Bytes(), []byte("\n"))); err != nil {
		return fmt.Errorf("write: %w", err)
	}
	return nil
}

// trailingSpace is what tabwriter leaves after the last column of a line.
var trailingSpace = regexp.MustCompile(` +\n`)

// DescriptionText is a key's description as indented plain text, wrapped
// for a terminal.
func DescriptionText(k config.KeyDoc) string {
	var p comment.Parser
	pr := comment.Printer{TextPrefix: "    ", TextCodePrefix: "        ", TextWidth: 72}
	return string(pr.Text(p.Parse(k.Description())))
}
