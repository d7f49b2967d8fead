package main

import (
	"bytes"
	"os"
	"regexp"
	"strings"
	"testing"
)

// synopsis is one command of the README's command reference.
type synopsis struct {
	line  string    // the synopsis, continuation lines joined
	cmd   string    // the command after "idemgate"
	calls []synCall // one per subcommand (or one for the command itself)
}

// synCall is one invocation the synopsis describes: the words to run it
// (positional placeholders replaced by "X") and the flags it shows.
type synCall struct {
	argv  []string
	flags []string
}

// readmeSynopses parses the code block under "## Command line" in
// README.md: each line starting with "idemgate " begins a command, indented
// lines continue it. Words: a lowercase word not after a flag is a
// subcommand; an upper-case word right after the command or a subcommand
// is a positional argument; -x and --xyz are flags, belonging to the
// subcommand before them (or the command).
func readmeSynopses(t *testing.T) []synopsis {
	t.Helper()
	b, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	s := string(b)
	i := strings.Index(s, "\n## Command line\n")
	if i < 0 {
		t.Fatal(`README.md has no "## Command line" section`)
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
			t.Fatalf("README synopsis line %q neither starts a command (idemgate …) nor continues one (indented)", l)
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
				if subs > 0 || len(cur.flags) > 0 || len(cur.argv) > 1 {
					syn.calls = append(syn.calls, cur)
				}
				subs++
				cur = synCall{argv: []string{words[1], w}}
				positional = true
			case placeholderRe.MatchString(w) && positional:
				cur.argv = append(cur.argv, "X")
			case choiceRe.MatchString(w) && positional:
				cur.argv = append(cur.argv, strings.Split(w, "|")[0])
			}
		}
		syn.calls = append(syn.calls, cur)
		out = append(out, syn)
	}
	return out
}

// helpFlags runs `idemgate ARGS -h` and returns the flags its help lists.
func helpFlags(t *testing.T, argv []string) map[string]bool {
	t.Helper()
	var stdout, stderr bytes.Buffer
	if code := run(append(append([]string{}, argv...), "-h"), strings.NewReader(""), &stdout, &stderr); code != 0 {
		t.Fatalf("idemgate %s -h: exit %d (is the command or subcommand real?)\n%s%s", strings.Join(argv, " "), code, stdout.String(), stderr.String())
	}
	flags := map[string]bool{}
	for _, m := range regexp.MustCompile(`(?m)^\s+-([a-z][a-z0-9-]*)\b`).FindAllStringSubmatch(stderr.String()+stdout.String(), -1) {
		flags[m[1]] = true
	}
	return flags
}

// TestReadmeSynopsisMatchesHelp: every command and subcommand of the
// README's command reference exists, every flag it shows is one the
// command's -h lists, every command that opens a ledger shows --db (and
// those that ask the order API show --orders-api), and every command is in
// the usage text.
func TestReadmeSynopsisMatchesHelp(t *testing.T) {
	syns := readmeSynopses(t)
	if len(syns) < 10 {
		t.Fatalf("found %d synopses in README.md; the parser lost them", len(syns))
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
				help := helpFlags(t, c.argv)
				for _, f := range c.flags {
					shown[f] = true
					if !help[f] {
						t.Errorf("README: `idemgate %s` shows -%s, which `idemgate %s -h` does not list\n  %s", strings.Join(c.argv, " "), f, strings.Join(c.argv, " "), syn.line)
					}
				}
				if help["db"] {
					need["db"] = true
				}
			}
			for f := range need {
				if !shown[f] {
					t.Errorf("README: `idemgate %s` needs --%s but its synopsis does not show it\n  %s", syn.cmd, f, syn.line)
				}
			}
		})
	}
}
