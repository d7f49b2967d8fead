package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"path/filepath"

	"idemgate/approvals"
	"idemgate/ledger"
	"idemgate/server"
)

// tokenFlags are the flags with which a command-line approver or a stdio
// server proves who it is with a token from the tokens file.
type tokenFlags struct {
	token  string
	tokens string
}

func (t *tokenFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&t.token, "token", env("IDEMGATE_TOKEN", ""), "a token from the tokens file: its principal, tenant and role replace --principal/--tenant/--role; required for approvals when the config sets require_approver_token (prefer env IDEMGATE_TOKEN: a flag is visible to other users in ps)")
	fs.StringVar(&t.tokens, "tokens", env("IDEMGATE_TOKENS", ""), "tokens file (default: tokens.json beside --db; env IDEMGATE_TOKENS)")
}

// identity returns who acts: the identity the flags name or, when a token
// is given, the token's. A flag given explicitly on the command line that
// names another principal, tenant or role than the token is an error
// (environment defaults are simply replaced). When needApprover is set and
// the configuration file sets require_approver_token, a token of the
// approver role is required; lf must be loaded.
func (t *tokenFlags) identity(lf *settings, fs *flag.FlagSet, flags server.Identity, needApprover bool) (server.Identity, error) {
	if t.token == "" && needApprover {
		if lf.file.RequireApproverToken {
			return flags, approverTokenNeeded(lf, true)
		}
		if ledgerRequiresApproverToken(lf) {
			return flags, approverTokenNeeded(lf, false)
		}
	}
	if t.token == "" {
		return flags, nil
	}
	path := t.tokens
	if path == "" {
		path = filepath.Join(lf.dataDir(), "tokens.json")
	}
	toks, err := server.LoadTokens(path)
	if err != nil {
		return flags, usageError{fmt.Errorf("--token: %w", err)}
	}
	id, ok, _ := toks.Lookup(t.token)
	if !ok {
		return flags, errors.New("forbidden: the token is not in the tokens file " + path + "; check IDEMGATE_TOKEN / --token and --tokens")
	}
	if needApprover && id.Role != approvals.RoleApprover {
		return flags, fmt.Errorf("forbidden: the token belongs to %s, whose role is %s; approvals and resolutions need a token of role approver", id.Principal, id.Role)
	}
	var errs []error
	fs.Visit(func(f *flag.Flag) {
		switch {
		case f.Name == "principal" && !ledger.SamePrincipal(flags.Principal, id.Principal):
			errs = append(errs, fmt.Errorf("--principal %s, but the token is %s's", flags.Principal, id.Principal))
		case f.Name == "tenant" && flags.Tenant != id.Tenant:
			errs = append(errs, fmt.Errorf("--tenant %s, but the token is of tenant %s", flags.Tenant, id.Tenant))
		case f.Name == "role" && flags.Role != id.Role:
			errs = append(errs, fmt.Errorf("--role %s, but the token's role is %s", flags.Role, id.Role))
		}
	})
	if err := errors.Join(errs...); err != nil {
		return flags, usageError{fmt.Errorf("%w (drop the flag: the token says who you are)", err)}
	}
	return id, nil
}

// approverTokenNeeded refuses an approver without a token, saying whether
// the configuration file (inConfig) or the ledger requires one, and how to
// get one.
func approverTokenNeeded(lf *settings, inConfig bool) error {
	const how = "approvals and resolutions need an approver's token: set IDEMGATE_TOKEN (or --token) to a token of role approver from the tokens file (create one with: idemgate tokens add --principal P --tenant T --role approver)"
	if inConfig {
		return fmt.Errorf("forbidden: the configuration (%s) sets require_approver_token, so %s", lf.configFile, how)
	}
	return fmt.Errorf("forbidden: the ledger %s requires approver tokens (a process configured with require_approver_token recorded it there), so %s", lf.db, how)
}

// The ledger remembers require_approver_token: a process whose
// configuration sets it records it in the ledger, and from then on every
// process on that ledger enforces it, whatever configuration it was
// given. Only an approver can lift it (idemgate approvals require-token
// off, with an approver's token).
const (
	settingsCollection    = "settings"
	settingApproverTokens = "require_approver_token"
)

// ledgerRequiresApproverToken reports whether lf's ledger records
// require_approver_token. A ledger that cannot be opened records nothing
// (the command's own open then reports why).
func ledgerRequiresApproverToken(lf *settings) bool {
	store, err := lf.openReadOnly()
	if err != nil {
		return false
	}
	defer store.Close()
	on, err := approverTokensRequired(context.Background(), store)
	return err == nil && on
}

// approverTokensRequired reports whether the ledger records
// require_approver_token.
func approverTokensRequired(ctx context.Context, store ledger.Store) (bool, error) {
	on := false
	err := store.View(ctx, func(tx ledger.Tx) error {
		v, err := tx.Get(settingsCollection, settingApproverTokens)
		on = string(v) == "true"
		return err
	})
	return on, err
}

// setApproverTokenRule records (on) or lifts the rule in the ledger.
func setApproverTokenRule(ctx context.Context, store ledger.Store, on bool) error {
	return store.Update(ctx, func(tx ledger.Tx) error {
		v, err := tx.Get(settingsCollection, settingApproverTokens)
		if err != nil {
			return err
		}
		if (string(v) == "true") == on {
			return nil
		}
		if on {
			return tx.Put(settingsCollection, settingApproverTokens, []byte("true"))
		}
		return tx.Delete(settingsCollection, settingApproverTokens)
	})
}
