package main

import (
	"errors"
	"flag"
	"io"
	"slices"
	"testing"
)

// TestParseCommand: a command's positional arguments may come before,
// between or after its flags, everything after "--" is positional, help is
// flag.ErrHelp with or without them, and a missing or surplus one is a
// usage error.
func TestParseCommand(t *testing.T) {
	for _, tc := range []struct {
		name    string
		args    []string
		want    []string // positional arguments, on success
		db      string
		errHelp bool
		usage   bool
	}{
		{"before the flags", []string{"K", "--db", "d"}, []string{"K"}, "d", false, false},
		{"after the flags", []string{"--db", "d", "K"}, []string{"K"}, "d", false, false},
		{"between the flags", []string{"--json", "K", "--db", "d"}, []string{"K"}, "d", false, false},
		{"after --", []string{"--db", "d", "--", "-K"}, []string{"-K"}, "d", false, false},
		{"help without the argument", []string{"--help"}, nil, "", true, false},
		{"help after the argument", []string{"K", "-h"}, nil, "", true, false},
		{"missing", []string{"--db", "d"}, nil, "", false, true},
		{"surplus", []string{"K", "L"}, nil, "", false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fs := flag.NewFlagSet("reconcile", flag.ContinueOnError)
			fs.SetOutput(io.Discard)
			db := fs.String("db", "", "")
			fs.Bool("json", false, "")
			got, err := parseCommand(fs, tc.args, "KEY")
			switch {
			case tc.errHelp:
				if !errors.Is(err, flag.ErrHelp) {
					t.Errorf("%q: %v, want flag.ErrHelp", tc.args, err)
				}
			case tc.usage:
				if !errors.As(err, new(usageError)) {
					t.Errorf("%q: %v, want a usage error", tc.args, err)
				}
			case err != nil:
				t.Errorf("%q: %v", tc.args, err)
			case !slices.Equal(got, tc.want) || *db != tc.db:
				t.Errorf("%q: arguments %q, --db %q; want %q, %q", tc.args, got, *db, tc.want, tc.db)
			}
		})
	}
}
