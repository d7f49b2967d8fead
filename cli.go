package main

import (
	"flag"
	"fmt"
	"io"
	"strings"
)

// Help on the command line. -h, -help, --h and --help ask for help
// wherever the flag package would read a flag, and help is never an error:
// `idemgate CMD --help` and `idemgate CMD SUB --help` print every flag the
// command takes, with its default, to stderr (where Go's flag package
// prints them) and exit 0 — whether or not the command's own arguments (a
// KEY, an ID, a FILE) are there. Commands with such arguments, and their
// sibling subcommands, begin the help with their synopsis (setUsage); the
// others with the flag package's "Usage of CMD:". A command family alone
// with --help (`idemgate ops --help`) prints its subcommands, exit 0; alone
// without it, the same as a usage error, exit 2. `idemgate help CMD [SUB]`
// is `idemgate CMD [SUB] --help`.

// isHelpArg reports whether arg asks for help as the flag package reads it.
func isHelpArg(arg string) bool {
	switch arg {
	case "-h", "-help", "--h", "--help":
		return true
	}
	return false
}

// groupHelp answers `idemgate FAMILY --help` (and `idemgate FAMILY help`):
// when args asks for help, it prints the family's usage use and how to get
// a subcommand's flags, and returns flag.ErrHelp (exit 0). Otherwise it
// returns nil.
func groupHelp(family, use string, args []string, stderr io.Writer) error {
	if len(args) == 0 || !(isHelpArg(args[0]) || args[0] == "help") {
		return nil
	}
	fmt.Fprintf(stderr, "%s\n\nRun \"idemgate %s SUBCOMMAND -h\" for a subcommand's flags.\n", use, family)
	return flag.ErrHelp
}

// setUsage makes fs's help begin with "usage: idemgate synopsis" and what
// the command does (about, one sentence) instead of the flag package's
// "Usage of NAME:", then list every flag.
func setUsage(fs *flag.FlagSet, synopsis, about string) {
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: idemgate %s\n\n%s\n\nflags:\n", synopsis, about)
		fs.PrintDefaults()
	}
}

// parseCommand parses the flags of a command that takes the positional
// arguments named in want (e.g. "KEY"): they may come before, between or
// after the flags (`reconcile KEY --db P` or `reconcile --db P KEY`);
// after a "--" everything is positional. -h/--help among the flags is
// flag.ErrHelp (the usage and every flag printed) even when an argument is
// missing. A missing or surplus argument is a usageError, printed with the
// usage and every flag, like a mistaken flag.
func parseCommand(fs *flag.FlagSet, args []string, want ...string) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		rest := fs.Args()
		if len(rest) == 0 {
			break
		}
		if used := args[:len(args)-len(rest)]; len(used) > 0 && used[len(used)-1] == "--" {
			pos = append(pos, rest...)
			break
		}
		pos = append(pos, rest[0])
		args = rest[1:]
	}
	var err error
	switch {
	case len(pos) < len(want):
		err = fmt.Errorf("%s needs %s", fs.Name(), strings.Join(want[len(pos):], " "))
	case len(pos) > len(want):
		err = fmt.Errorf("%s: unexpected arguments %q", fs.Name(), pos[len(want):])
	default:
		return pos, nil
	}
	fmt.Fprintln(fs.Output(), err)
	fs.Usage()
	return nil, usageError{err}
}
