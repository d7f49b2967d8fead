package main

import (
	"bytes"
	"context"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// cliDoc is the command reference: its "# Command line" code block holds
// one synopsis per command.
const cliDoc = "docs/cli.md"

// synopsis is one command of the command reference, docs/cli.md.
type synopsis struct {
	line  string    // the synopsis, continuation lines joined
	cmd   string    // the command after "idemgate"
	calls []synCall // one per subcommand (or one for the command itself)
}

// synCall is one invocation the synopsis describes: the command and
// subcommand words, its positional arguments (placeholders replaced by
// "X", a choice by its first value) and the flags it shows.
type synCall struct {
	argv  []string
	args  []string
	flags []string
}

// cliSynopses parses the code block under "# Command line" in
// docs/cli.md: each line starting with "idemgate " begins a command, indented
// lines continue it. Words: a lowercase word not after a flag is a
// subcommand; an upper-case word right after the command or a subcommand
// is a positional argument; -x and --xyz are flags, belonging to the
// subcommand before them (or the command).
func cliSynopses(t *testing.T) []synopsis {
	t.Helper()
	b, err := os.ReadFile(cliDoc)
	if err != nil {
		t.Fatal(err)
	}
	s := string(b)
	i := strings.Index("\n"+s, "\n# Command line\n")
	if i < 0 {
		t.Fatalf(`%s has no "# Command line" section`, cliDoc)
	}
	s = s[i:]
	start := strings.Index(s, "```\n")
	if start < 0 {
		t.Fatal("the Command line section has no code block")
	}
	s = s[start+4:]
	s = s[:strings.Index(s, "```")]
	var lines []string
	for _, l := range strings.Split(s, "\n") {
		switch {
		case strings.HasPrefix(l, "idemgate "):
			lines = append(lines, l)
		case strings.TrimSpace(l) == "":
		case len(lines) > 0 && (l[0] == ' ' || l[0] == '\t'):
			lines[len(lines)-1] += " " + strings.TrimSpace(l)
		default:
			t.Fatalf("%s: synopsis line %q neither starts a command (idemgate …) nor continues one (indented)", cliDoc, l)
		}
	}
	flagRe := regexp.MustCompile(`^--?[a-z][a-z0-9-]*$`)
	subRe := regexp.MustCompile(`^[a-z][a-z0-9-]*$`)
	placeholderRe := regexp.MustCompile(`^[A-Z][A-Z0-9_]*$`)
	choiceRe := regexp.MustCompile(`^[a-z]+(\|[a-z]+)+$`) // a positional value given as its choices: on|off
	var out []synopsis
	for _, l := range lines {
		words := strings.Fields(strings.NewReplacer("[", " ", "]", " ").Replace(l))
		syn := synopsis{line: l, cmd: words[1]}
		cur := synCall{argv: []string{words[1]}}
		positional := true // placeholders right after the command are its arguments
		subs := 0
		for j := 2; j < len(words); j++ {
			w := words[j]
			prevFlag := flagRe.MatchString(words[j-1])
			switch {
			case w == "|":
			case flagRe.MatchString(w):
				cur.flags = append(cur.flags, strings.TrimLeft(w, "-"))
				positional = false
			case prevFlag:
				// the flag's value
			case subRe.MatchString(w):
				if subs > 0 || len(cur.flags) > 0 || len(cur.args) > 0 {
					syn.calls = append(syn.calls, cur)
				}
				subs++
				cur = synCall{argv: []string{words[1], w}}
				positional = true
			case placeholderRe.MatchString(w) && positional:
				cur.args = append(cur.args, "X")
			case choiceRe.MatchString(w) && positional:
				cur.args = append(cur.args, strings.Split(w, "|")[0])
			}
		}
		syn.calls = append(syn.calls, cur)
		out = append(out, syn)
	}
	return out
}

// runHelp runs `idemgate ARGV...` in process, as a user types it, and
// returns its exit code and everything it printed.
func runHelp(argv ...string) (int, string) {
	var stdout, stderr bytes.Buffer
	code := run(context.Background(), argv, strings.NewReader(""), &stdout, &stderr)
	return code, stdout.String() + stderr.String()
}

// helpFlags runs `idemgate CMD [SUB] --help`, the form a user types, and
// returns the flags its help lists. The help must be the same with -h and
// with the command's positional arguments given (`idemgate reconcile KEY
// --help`), and exit 0 in every form.
func helpFlags(t *testing.T, c synCall) map[string]bool {
	t.Helper()
	name := strings.Join(c.argv, " ")
	code, help := runHelp(append(slices.Clip(c.argv), "--help")...)
	if code != 0 {
		t.Fatalf("idemgate %s --help: exit %d, want 0 (is the command or subcommand real?)\n%s", name, code, help)
	}
	for _, argv := range [][]string{
		append(slices.Clip(c.argv), "-h"),
		append(append(slices.Clip(c.argv), c.args...), "--help"),
	} {
		if code, other := runHelp(argv...); code != 0 || other != help {
			t.Errorf("idemgate %s: exit %d, printed\n%s\nwant exit 0 and the same help as idemgate %s --help:\n%s", strings.Join(argv, " "), code, other, name, help)
		}
	}
	flags := map[string]bool{}
	for _, m := range regexp.MustCompile(`(?m)^\s+-([a-z][a-z0-9-]*)\b`).FindAllStringSubmatch(help, -1) {
		flags[m[1]] = true
	}
	if len(flags) == 0 && name != "version" {
		t.Errorf("idemgate %s --help lists no flags:\n%s", name, help)
	}
	return flags
}

// TestReadmeSynopsisMatchesHelp: every command and subcommand of the
// command reference (docs/cli.md) exists, every flag it shows is one that
// `idemgate CMD [SUB] --help` lists (the same help with -h and with the
// command's arguments given, exit 0), every command that opens a ledger
// shows --db (and those that ask the order API show --orders-api), and
// every command is in the usage text.
func TestReadmeSynopsisMatchesHelp(t *testing.T) {
	syns := cliSynopses(t)
	if len(syns) < 10 {
		t.Fatalf("found %d synopses in %s; the parser lost them", len(syns), cliDoc)
	}
	needs := map[string][]string{"reconcile": {"orders-api"}, "resolve": {"orders-api"}}
	for _, syn := range syns {
		name := strings.Join(syn.calls[0].argv, " ")
		t.Run(name, func(t *testing.T) {
			if !strings.Contains(usage, "idemgate "+syn.cmd) {
				t.Errorf("the usage text (main.go) does not list idemgate %s", syn.cmd)
			}
			shown := map[string]bool{}
			need := map[string]bool{}
			for _, f := range needs[syn.cmd] {
				need[f] = true
			}
			for _, c := range syn.calls {
				help := helpFlags(t, c)
				for _, f := range c.flags {
					shown[f] = true
					if !help[f] {
						t.Errorf("%s: `idemgate %s` shows -%s, which `idemgate %s --help` does not list\n  %s", cliDoc, strings.Join(c.argv, " "), f, strings.Join(c.argv, " "), syn.line)
					}
				}
				if help["db"] {
					need["db"] = true
				}
			}
			for f := range need {
				if !shown[f] {
					t.Errorf("%s: `idemgate %s` needs --%s but its synopsis does not show it\n  %s", cliDoc, syn.cmd, f, syn.line)
				}
			}
		})
	}
}

// TestHelpWithoutArguments: a command family alone with --help (or -h,
// or help) lists its subcommands and exits 0; `idemgate help CMD SUB` is
// `idemgate CMD SUB --help`; a command missing its positional argument
// exits 2 saying which, with the whole flag list, not a one-line usage.
func TestHelpWithoutArguments(t *testing.T) {
	for _, tc := range []struct {
		family string
		subs   []string
	}{
		{"ops", []string{"list", "show"}},
		{"approvals", []string{"list", "show", "approve", "reject", "require-token"}},
		{"audit", []string{"verify", "tail", "export", "prune"}},
		{"tokens", []string{"add"}},
		{"outbox", []string{"requeue"}},
	} {
		for _, h := range []string{"--help", "-h", "help"} {
			code, out := runHelp(tc.family, h)
			if code != 0 {
				t.Errorf("idemgate %s %s: exit %d, want 0\n%s", tc.family, h, code, out)
			}
			for _, s := range tc.subs {
				if !strings.Contains(out, " "+s) {
					t.Errorf("idemgate %s %s does not name the subcommand %s:\n%s", tc.family, h, s, out)
				}
			}
		}
		if code, out := runHelp(tc.family); code != 2 {
			t.Errorf("idemgate %s alone: exit %d, want 2 (a usage error)\n%s", tc.family, code, out)
		}
	}

	_, direct := runHelp("ops", "show", "--help")
	if code, out := runHelp("help", "ops", "show"); code != 0 || out != direct {
		t.Errorf("idemgate help ops show: exit %d, printed\n%s\nwant exit 0 and idemgate ops show --help's\n%s", code, out, direct)
	}

	for _, tc := range []struct {
		argv    []string
		missing string
		flags   []string
	}{
		{[]string{"reconcile"}, "KEY", []string{"-config", "-tokens", "-db", "-orders-api"}},
		{[]string{"resolve", "--outcome", "succeeded"}, "KEY", []string{"-config", "-tokens", "-evidence"}},
		{[]string{"ops", "show"}, "KEY", []string{"-db", "-limit"}},
		{[]string{"approvals", "approve", "--comment", "ok"}, "ID", []string{"-principal", "-token"}},
		{[]string{"backup"}, "FILE", []string{"-db"}},
		{[]string{"outbox", "requeue"}, "MESSAGE_ID", []string{"-principal", "-db"}},
	} {
		name := strings.Join(tc.argv, " ")
		code, out := runHelp(tc.argv...)
		if code != 2 || !strings.Contains(out, "needs "+tc.missing) {
			t.Errorf("idemgate %s: exit %d, want 2 saying it needs %s\n%s", name, code, tc.missing, out)
		}
		for _, f := range tc.flags {
			if !strings.Contains(out, "  "+f+" ") {
				t.Errorf("idemgate %s: the usage it prints does not list %s\n%s", name, f, out)
			}
		}
	}
}
