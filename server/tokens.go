package server

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"
)

// Tokens maps bearer tokens to identities. Only SHA-256 hashes of the
// tokens are stored, in a JSON file the operator manages with `idemgate
// tokens add`. The file is re-read when it changes, so a token added or
// removed takes effect without a restart. Safe for concurrent use.
type Tokens struct {
	path string

	mu      sync.Mutex
	modTime time.Time
	size    int64
	byHash  map[string]Identity
}

// tokenEntry is one line of the tokens file.
type tokenEntry struct {
	SHA256    string `json:"sha256"` // hex SHA-256 of the token
	Principal string `json:"principal"`
	Tenant    string `json:"tenant"`
	Role      string `json:"role"`
	// OnBehalfOf and Model are the user the token's agent acts for and its
	// model, recorded on every audit entry of the token's calls.
	OnBehalfOf string    `json:"on_behalf_of,omitempty"`
	Model      string    `json:"model,omitempty"`
	CreatedAt  time.Time `json:"created_at"`
	Note       string    `json:"note,omitempty"`
}

type tokenFile struct {
	Tokens []tokenEntry `json:"tokens"`
}

// maxTokenFile bounds the tokens file.
const maxTokenFile = 4 << 20

// LoadTokens reads the tokens file at path; a missing or invalid file is
// an error naming what is wrong.
func LoadTokens(path string) (*Tokens, error) {
	t := &Tokens{path: path}
	if err := t.reload(); err != nil {
		return nil, err
	}
	return t, nil
}

func readTokenFile(path string) (tokenFile, error) {
	var f tokenFile
	b, err := os.ReadFile(path)
	if err != nil {
		return f, fmt.Errorf("tokens file: %w", err)
	}
	if len(b) > maxTokenFile {
		return f, fmt.Errorf("tokens file %s: larger than %d bytes", path, maxTokenFile)
	}
	dec := json.NewDecoder(strings.NewReader(string(b)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&f); err != nil {
		return f, fmt.Errorf("tokens file %s: %w", path, err)
	}
	return f, nil
}

// reload re-reads the file if it changed since the last read; the caller
// must not hold t.mu.
func (t *Tokens) reload() error {
	st, err := os.Stat(t.path)
	if err != nil {
		return fmt.Errorf("tokens file: %w", err)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.byHash != nil && st.ModTime().Equal(t.modTime) && st.Size() == t.size {
		return nil
	}
	f, err := readTokenFile(t.path)
	if err != nil {
		return err
	}
	byHash := make(map[string]Identity, len(f.Tokens))
	for i, e := range f.Tokens {
		id := Identity{Principal: e.Principal, Tenant: e.Tenant, Role: e.Role, OnBehalfOf: e.OnBehalfOf, Model: e.Model}
		if err := id.Validate(); err != nil {
			return fmt.Errorf("tokens file %s: entry %d: %w", t.path, i+1, err)
		}
		if len(e.SHA256) != 64 {
			return fmt.Errorf("tokens file %s: entry %d: sha256 must be 64 hex digits", t.path, i+1)
		}
		byHash[strings.ToLower(e.SHA256)] = id
	}
	t.byHash, t.modTime, t.size = byHash, st.ModTime(), st.Size()
	return nil
}

// Lookup returns the identity of a bearer token. A file that became
// unreadable keeps the last good set of tokens (the error is returned for
// logging alongside the lookup).
func (t *Tokens) Lookup(token string) (Identity, bool, error) {
	rerr := t.reload()
	sum := sha256.Sum256([]byte(token))
	t.mu.Lock()
	defer t.mu.Unlock()
	id, ok := t.byHash[hex.EncodeToString(sum[:])]
	return id, ok, rerr
}

// AddToken creates a new random token for id, appends its hash to the
// file at path (creating it with mode 0600), and returns the token: the
// only time it is ever shown.
func AddToken(path string, id Identity, note string) (string, error) {
	if err := id.Validate(); err != nil {
		return "", err
	}
	if len(note) > 200 {
		return "", errors.New("note: at most 200 characters")
	}
	var f tokenFile
	if _, err := os.Stat(path); err == nil {
		if f, err = readTokenFile(path); err != nil {
			return "", err
		}
	} else if !errors.Is(err, os.ErrNotExist) {
		return "", err
	}
	raw := make([]byte, 32)
	if _, err := rand.Read(raw); err != nil {
		return "", err
	}
	token := "igt_" + base64.RawURLEncoding.EncodeToString(raw)
	sum := sha256.Sum256([]byte(token))
	f.Tokens = append(f.Tokens, tokenEntry{SHA256: hex.EncodeToString(sum[:]), Principal: id.Principal, Tenant: id.Tenant, Role: id.Role,
		OnBehalfOf: id.OnBehalfOf, Model: id.Model, CreatedAt: time.Now().UTC(), Note: note})
	b, err := json.MarshalIndent(f, "", "  ")
	if err != nil {
		return "", err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return "", err
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), ".tokens-*")
	if err != nil {
		return "", err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(append(b, '\n')); err != nil {
		tmp.Close()
		return "", err
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return "", err
	}
	if err := tmp.Close(); err != nil {
		return "", err
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return "", err
	}
	return token, nil
}
