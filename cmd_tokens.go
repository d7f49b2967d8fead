package main

import (
	"errors"
	"flag"
	"fmt"
	"idemgate/server"
	"io"
	"path/filepath"
)

// tokensCmd creates bearer tokens for the HTTP transport.
func tokensCmd(args []string, stdout, stderr io.Writer) error {
	const use = "usage: idemgate tokens add --principal P --tenant T --role agent|approver [--on-behalf-of USER] [--model MODEL] [--tokens FILE] [--note TEXT]"
	if err := groupHelp("tokens", use, args, stderr); err != nil {
		return err
	}
	if len(args) == 0 || args[0] != "add" {
		return usageError{errors.New(use)}
	}
	fs := flag.NewFlagSet("tokens add", flag.ContinueOnError)
	fs.SetOutput(stderr)
	setUsage(fs, "tokens add --principal P --tenant T --role agent|approver [flags]", "Creates a bearer token for serve --http and the console; the token is printed once and stored hashed.")
	var id server.Identity
	fs.StringVar(&id.Principal, "principal", "", "who the token acts for")
	fs.StringVar(&id.Tenant, "tenant", "default", "the token's tenant")
	fs.StringVar(&id.Role, "role", "agent", "agent or approver")
	fs.StringVar(&id.OnBehalfOf, "on-behalf-of", "", "the user the token's agent acts for, recorded on its audit entries (at most 128 bytes)")
	fs.StringVar(&id.Model, "model", "", "the model driving the token's agent, recorded on its audit entries (at most 128 bytes)")
	file := fs.String("tokens", env("IDEMGATE_TOKENS", ""), "tokens file (default: tokens.json beside the default ledger)")
	note := fs.String("note", "", "what the token is for (at most 200 characters)")
	if _, err := parseCommand(fs, args[1:]); err != nil {
		return err
	}
	if *file == "" {
		*file = filepath.Join(dataDirOf(env("IDEMGATE_DB", defaultDB())), "tokens.json")
	}
	if err := id.Validate(); err != nil {
		return usageError{err}
	}
	token, err := server.AddToken(*file, id, *note)
	if err != nil {
		return err
	}
	fmt.Fprintf(stderr, "added a token for %s (tenant %s, role %s%s) to %s; it is shown only now:\n", id.Principal, id.Tenant, id.Role, delegationText(id), *file)
	fmt.Fprintln(stdout, token)
	return nil
}

// delegationText describes a token's configured user and model, if any.
func delegationText(id server.Identity) string {
	s := ""
	if id.OnBehalfOf != "" {
		s += ", on behalf of " + id.OnBehalfOf
	}
	if id.Model != "" {
		s += ", model " + id.Model
	}
	return s
}
