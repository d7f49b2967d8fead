package main

import (
	"context"
	"flag"
	"idemgate/demo"
	"io"
	"os"
)

func runDemo(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("demo", flag.ContinueOnError)
	fs.SetOutput(stderr)
	keep := fs.Bool("keep", false, "keep the demo's temporary ledger and print its path")
	if err := fs.Parse(args); err != nil {
		return err
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	return demo.Run(context.Background(), self, stdout, *keep)
}
