// Command hopper is the RabbitMQ consumer sidecar. This file only wires:
// config, logger, signals, subcommands.
package main

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/hopper-sidecar/hopper/config"
)

// version is stamped at build time with -ldflags "-X main.version=...".
var version = "dev"

// errReported marks an error already printed in full, so main only sets
// the exit code.
var errReported = errors.New("reported")

func main() {
	os.Exit(execute(newRoot(os.Stdout, os.Stderr), os.Stderr))
}

// execute runs the command line and returns the exit status of its
// outcome, printing the error unless it was printed in full already.
func execute(root *cobra.Command, stderr io.Writer) int {
	err := root.Execute()
	if err != nil && !errors.Is(err, errReported) {
		fmt.Fprintln(stderr, "hopper:", err)
	}
	return exitCode(err)
}

func newRoot(stdout, stderr io.Writer) *cobra.Command {
	root := &cobra.Command{
		Use:   "hopper",
		Short: "RabbitMQ consumer sidecar: delivers each message to your app over HTTP",
		Long: `Hopper consumes a RabbitMQ queue and POSTs each message to an HTTP app.
The app's response decides the message's fate: 2xx ack, 425 requeue,
408/409/429/5xx retry through a delay-tier queue, other 4xx or too many
attempts the dead-letter queue. Moves are publish -> confirm -> ack.

` + exitCodes,
		Version:       version,
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	// -v is left unassigned: kubectl and the tools around a broker use it
	// for verbosity, so it must not mean anything else here. Declared
	// first, the flag keeps cobra from taking -v as its shorthand.
	root.Flags().Bool("version", false, "print Hopper's version (as does `hopper version`)")
	root.SetOut(stdout)
	root.SetErr(stderr)
	root.AddCommand(newRunCmd(), newConfigCmd(), newTopologyCmd(), newDLQCmd(), newParkedCmd(), newStreamCmd(), newVersionCmd())
	refuseUnknown(root)
	markUsage(root)
	return root
}

// newVersionCmd prints the version the binary was built as.
func newVersionCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print Hopper's version",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			_, err := fmt.Fprintln(cmd.OutOrStdout(), "hopper", version)
			return err
		},
	}
}

// refuseUnknown makes every command that only groups subcommands fail on
// an unknown one, with suggestions, instead of printing its help and
// exiting 0: a typo at 3 a.m. must not look like success.
func refuseUnknown(cmd *cobra.Command) {
	for _, c := range cmd.Commands() {
		refuseUnknown(c)
	}
	if !cmd.HasSubCommands() || cmd.Run != nil || cmd.RunE != nil {
		return
	}
	cmd.Args = cobra.ArbitraryArgs
	cmd.SuggestionsMinimumDistance = 2
	cmd.RunE = func(c *cobra.Command, args []string) error {
		if len(args) == 0 {
			return c.Help()
		}
		msg := fmt.Sprintf("unknown command %q for %q", args[0], c.CommandPath())
		if s := c.SuggestionsFor(args[0]); len(s) > 0 {
			msg += "\n\nDid you mean this?\n\t" + strings.Join(s, "\n\t")
		}
		return usage(fmt.Errorf("%s\n\nRun '%s --help' for usage", msg, c.CommandPath()))
	}
}

// markUsage marks as usage errors what cobra itself refuses: a flag it
// cannot parse, and arguments a command does not take.
func markUsage(root *cobra.Command) {
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usage(err) })
	var walk func(*cobra.Command)
	walk = func(cmd *cobra.Command) {
		if args := cmd.Args; args != nil {
			cmd.Args = func(c *cobra.Command, a []string) error { return usage(args(c, a)) }
		}
		for _, c := range cmd.Commands() {
			walk(c)
		}
	}
	walk(root)
}

// configFlags are the flags every subcommand that reads config has. The
// main keys have their own flags; flags win over HOPPER_* variables, which
// win over the file.
type configFlags struct {
	file string
	set  []string
	// user is the kind of command the flags are for: each has only the
	// key flags it makes use of, so that its --help lists nothing it
	// would ignore. The zero value is run's (and config validate's): all.
	user flagUser
}

// flagUser is a kind of command, for picking which key flags it has.
type flagUser int

const (
	// forRun: run, and config validate, which checks run's config.
	forRun flagUser = 1 << iota
	// forBroker: the tools that connect to the broker but deliver nothing
	// to the app (topology apply and verify, the dlq commands).
	forBroker
	// forPlan: topology plan, which only computes names and arguments.
	forPlan
)

// flagUsers are the kinds of command that use each of config.Flags (by
// flag name); a flag not listed here is run's (and config validate's) only.
var flagUsers = map[string]flagUser{
	"queue":      forRun | forBroker | forPlan,
	"broker-url": forRun | forBroker,
	"log-level":  forRun | forBroker,
	"log-format": forRun | forBroker,
}

// usedBy says whether the commands of kind user have flag f.
func usedBy(f config.Flag, user flagUser) bool {
	users, ok := flagUsers[f.Name]
	if !ok {
		users = forRun
	}
	return users&user != 0
}

func (f *configFlags) register(fs *pflag.FlagSet) {
	user := f.user
	if user == 0 {
		user = forRun
	}
	fs.StringVarP(&f.file, "config", "c", os.Getenv("HOPPER_CONFIG"), "YAML config file (env HOPPER_CONFIG)")
	for _, k := range config.Flags() {
		if usedBy(k, user) {
			fs.String(k.Name, "", k.Usage+" ("+k.Key+")")
		}
	}
	fs.StringArrayVar(&f.set, "set", nil, "set any key: --set retry.maxAttempts=5 (repeatable)")
}

// load reads file, environment and flags, then validates. Every problem is
// printed, one per line, with its key path.
func (f *configFlags) load(cmd *cobra.Command) (config.Config, error) {
	environ := make([]string, 0, 16)
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "HOPPER_CONFIG=") {
			environ = append(environ, kv)
		}
	}
	cfg, warnings, err := config.Load(f.file, environ)
	var errs []error
	if err != nil {
		errs = append(errs, err)
	}
	for _, w := range warnings {
		fmt.Fprintf(cmd.ErrOrStderr(), "warning: environment variable %s matches no config key\n", w)
	}
	for _, k := range config.Flags() {
		fl := cmd.Flags().Lookup(k.Name)
		if fl != nil && fl.Changed {
			if err := config.SetKey(&cfg, k.Key, fl.Value.String()); err != nil {
				errs = append(errs, fmt.Errorf("--%s: %w", k.Name, err))
			}
		}
	}
	for _, kv := range f.set {
		key, value, ok := strings.Cut(kv, "=")
		if !ok {
			errs = append(errs, fmt.Errorf("--set %q: want key=value", kv))
			continue
		}
		if err := config.SetKey(&cfg, key, value); err != nil {
			errs = append(errs, fmt.Errorf("--set: %w", err))
		}
	}
	// Validate even when loading failed, so every problem shows in one run;
	// but not without the file: every key it would have set would be
	// reported missing, burying the one problem to fix.
	if !errors.Is(err, fs.ErrNotExist) {
		if err := cfg.Validate(); err != nil {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return cfg, report(cmd, err)
	}
	return cfg, nil
}

// report prints a joined error one problem per line. Flags and --set are
// sources of config like the file, so a bad value there is bad config too.
func report(cmd *cobra.Command, err error) error {
	lines := strings.Split(err.Error(), "\n")
	fmt.Fprintf(cmd.ErrOrStderr(), "hopper: invalid configuration (%d problem(s)):\n", len(lines))
	for _, l := range lines {
		fmt.Fprintf(cmd.ErrOrStderr(), "  - %s\n", l)
	}
	return badData(&reportedProblems{lines: lines})
}

func newLogger(cfg config.Log, w io.Writer) *slog.Logger {
	var level slog.Level
	if err := level.UnmarshalText([]byte(cfg.Level)); err != nil {
		level = slog.LevelInfo
	}
	opts := &slog.HandlerOptions{Level: level}
	if cfg.Format == "text" {
		return slog.New(slog.NewTextHandler(w, opts))
	}
	return slog.New(slog.NewJSONHandler(w, opts))
}
