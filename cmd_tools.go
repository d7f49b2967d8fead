package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"

	"idemgate/declared"
	"idemgate/server"
)

// toolsCmd is `idemgate tools check|import`: the declared tools of the
// configuration (docs/declared-tools.md).
func toolsCmd(args []string, stdout, stderr io.Writer) error {
	const use = "usage: idemgate tools check [--config FILE]\n       idemgate tools import OPENAPI_FILE --operation ID [--operation ID…] --base-url URL [--out FILE]"
	if err := groupHelp("tools", use, args, stderr); err != nil {
		return err
	}
	if len(args) == 0 {
		return usageError{errors.New(use)}
	}
	switch args[0] {
	case "check":
		return toolsCheck(args[1:], stdout, stderr)
	case "import":
		return toolsImport(args[1:], stdout, stderr)
	}
	return usageError{fmt.Errorf("tools: unknown subcommand %q\n%s", args[0], use)}
}

// toolsCheck validates the declared tools of the configuration (its
// [[tools]] and tools_dir), reading their secrets as serve would, and
// prints each as tools/list will publish it, as JSON, one after another.
// Any problem is an error naming the tool and the key, exit 2.
func toolsCheck(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("tools check", flag.ContinueOnError)
	fs.SetOutput(stderr)
	setUsage(fs, "tools check [--config FILE]", "Checks the declared tools of the configuration ([[tools]] and tools_dir) as serve would, secrets included, and prints each as tools/list publishes it.")
	config := fs.String("config", env("IDEMGATE_CONFIG", ""), "configuration file whose [[tools]] and tools_dir to check (env IDEMGATE_CONFIG)")
	if _, err := parseCommand(fs, args); err != nil {
		return err
	}
	// The configuration as serve loads it, with serve's defaults (the
	// ledger's flags play no part in the declared tools).
	var l settings
	l.register(flag.NewFlagSet("tools check", flag.ContinueOnError))
	l.configFile = *config
	if err := l.load(); err != nil {
		return err
	}
	built, _, err := l.declaredTools()
	if err != nil {
		return err
	}
	if len(built) == 0 {
		return usageError{errors.New("no tools are declared: add [[tools]] to the configuration (--config) or name a tools_dir")}
	}
	for _, t := range built {
		b, err := server.PublishedTool(t.Spec())
		if err != nil {
			return err
		}
		fmt.Fprintf(stdout, "%s\n", b)
	}
	fmt.Fprintf(stderr, "declared tools checked: %d, no problem found\n", len(built))
	return nil
}

// toolsImport writes declarations of an OpenAPI document's operations
// (declared.Import) to --out or stdout, for a person to review.
func toolsImport(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("tools import", flag.ContinueOnError)
	fs.SetOutput(stderr)
	setUsage(fs, "tools import OPENAPI_FILE --operation ID [--operation ID…] --base-url URL [--out FILE]",
		"Writes [[tools]] declarations of the named operations of an OpenAPI 3.x document (JSON or YAML), for a person to review before serving them.")
	var ops stringList
	fs.Var(&ops, "operation", "an operationId to declare (repeat for more)")
	base := fs.String("base-url", "", "where the API is (http(s)://host[:port][/path]); the document's servers are not trusted for this")
	out := fs.String("out", "", "write the declarations to this file (refused if it exists) instead of stdout")
	pos, err := parseCommand(fs, args, "OPENAPI_FILE")
	if err != nil {
		return err
	}
	doc, err := readFileBounded(pos[0], 4<<20)
	if err != nil {
		return usageError{err}
	}
	text, err := declared.Import(doc, ops, *base)
	if err != nil {
		return usageError{err}
	}
	if *out == "" {
		_, err = io.WriteString(stdout, text)
		return err
	}
	f, err := os.OpenFile(*out, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return usageError{err}
	}
	if _, err := io.WriteString(f, text); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// readFileBounded reads a regular file of at most limit bytes.
func readFileBounded(path string, limit int64) ([]byte, error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	if !st.Mode().IsRegular() || st.Size() > limit {
		return nil, fmt.Errorf("%s: not a regular file of at most %d bytes", path, limit)
	}
	return os.ReadFile(path)
}
