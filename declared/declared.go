// Package declared turns side-effecting tools declared in configuration
// ([[tools]] in the TOML configuration file, or in a directory of such
// files) into tools of the gate: each becomes a tools.Declared whose
// calls go through the same path as create_order over the order API —
// one execution per operation key, replay, refusal of a changed request,
// unknown outcomes settled by the API's lookup and never re-sent blindly,
// policy and approvals, audit and stats. See docs/declared-tools.md.
//
// Guarantees:
//
//   - A declaration is checked whole when it is loaded (Build), and every
//     problem is named with its tool and key: the input schema is held to
//     the house rules (schemas.CheckRules); every {placeholder} of a URL
//     or header names a required argument of a plain type, a secret the
//     declaration names, or {operation_key}; a URL's scheme and host are
//     literal, so no argument can send a request elsewhere.
//   - Secrets (API keys, tokens) come from the environment or from files
//     the declaration names, are read once at load, go only into
//     headers, and are never part of what is audited (method, path,
//     status) or answered: an API answer quoting one has it replaced by
//     [secret].
//   - Each request is sent once per attempt (no transport-level retry)
//     and classified by orders.Classify, with the declaration's overrides.
package declared

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/BurntSushi/toml"

	"idemgate/approvals"
	"idemgate/orders"
)

// File is a file of declarations: [[tools]] tables, nothing else.
type File struct {
	Tools []Decl `toml:"tools"`
}

// Decl is one declared tool as written in TOML ([[tools]]).
type Decl struct {
	// Name is the tool's name in tools/list (snake_case).
	Name string `toml:"name"`
	// Title and Description are what a client and the model read; the
	// gate appends how operation_key is to be used to the description.
	Title       string `toml:"title"`
	Description string `toml:"description"`
	// Noun is what an answer calls one operation ("refund"), and the
	// member of the saved result holding the API's answer. Default: the
	// name.
	Noun string `toml:"noun"`
	// Destructive and OpenWorld are the behaviour hints (default true
	// both, as MCP's defaults); the tool is always idempotent (keyed) and
	// never read-only.
	Destructive *bool `toml:"destructive"`
	OpenWorld   *bool `toml:"open_world"`
	// InputSchema is the JSON Schema of the business arguments (inline
	// JSON), or InputSchemaFile names a file holding it, relative to the
	// declaring file. operation_key is added by the gate.
	InputSchema     string `toml:"input_schema"`
	InputSchemaFile string `toml:"input_schema_file"`
	// SafeRetry says the API acts once on a request repeated with the
	// same key (it honours the key): only then is an operation its lookup
	// proved absent re-sent without a human approving it.
	SafeRetry bool `toml:"safe_retry"`
	// Timeout bounds one request (default 10s).
	Timeout approvals.Duration `toml:"timeout"`
	// ID is a JSON pointer to the resource's id in the API's answer
	// (e.g. "/id"), recorded as the operation's downstream reference.
	ID           string            `toml:"id"`
	Request      Request           `toml:"request"`
	OperationKey KeyPassing        `toml:"operation_key"`
	Outcome      Outcome           `toml:"outcome"`
	Lookup       *Lookup           `toml:"lookup"`
	Current      *CurrentState     `toml:"current"`
	Policy       Policy            `toml:"policy"`
	Secrets      map[string]Secret `toml:"secrets"`

	// dir is the directory of the declaring file (for InputSchemaFile).
	dir string
}

// Request is the HTTP request a call makes.
type Request struct {
	// Method is POST, PUT, PATCH or DELETE.
	Method string `toml:"method"`
	// URL is a template: {arg} is a required argument (escaped for where
	// it stands), {operation_key} the key sent downstream.
	URL string `toml:"url"`
	// Headers are templates too; {secret:NAME} is a secret of Secrets.
	Headers map[string]string `toml:"headers"`
	// Body maps each top-level field of the JSON body to a JSON pointer
	// into the arguments ("/amount_minor"); an argument left out is left
	// out. Empty: the arguments themselves (without operation_key) for
	// POST, PUT and PATCH, no body for DELETE.
	Body map[string]string `toml:"body"`
}

// KeyPassing is how the operation key reaches the API: exactly one of a
// header (Idempotency-Key), a top-level body field, or none.
type KeyPassing struct {
	Header    string `toml:"header"`
	BodyField string `toml:"body_field"`
	None      bool   `toml:"none"`
}

// Outcome overrides how statuses are classified (orders.Classify's
// defaults otherwise): each list names statuses of that class.
type Outcome struct {
	Definitive    []int `toml:"definitive"`
	NotSent       []int `toml:"not_sent"`
	Indeterminate []int `toml:"indeterminate"`
}

// Lookup is how an operation whose outcome was lost is found: a GET by
// the key (or by the client reference field the key was sent in).
type Lookup struct {
	// URL is a template like Request.URL.
	URL string `toml:"url"`
	// Headers as Request.Headers (the request's own are not reused).
	Headers map[string]string `toml:"headers"`
	// AbsentStatus are the statuses that mean "nothing for this key"
	// (default [404]).
	AbsentStatus []int `toml:"absent_status"`
	// Items, when set, is a JSON pointer to an array in the answer (a
	// search): the resource is its first element whose Match field equals
	// the key sent (any first element when Match is ""); none is absent.
	Items string `toml:"items"`
	Match string `toml:"match"`
	// Result is a JSON pointer to the resource in an answer without
	// Items (default: the whole answer).
	Result string `toml:"result"`
}

// CurrentState is how the resource a call changes is read as it is now
// (a GET): the approver sees the change as a diff from it, and the
// approved request carries the version read as If-Match.
type CurrentState struct {
	// URL and Headers as Lookup's ({operation_key} is not known to the
	// resource, so the URL names it by arguments).
	URL     string            `toml:"url"`
	Headers map[string]string `toml:"headers"`
	// Result is a JSON pointer to the resource in the answer (default:
	// the whole answer).
	Result string `toml:"result"`
	// Version is a JSON pointer to the resource's version in it; empty:
	// the answer's ETag header.
	Version string `toml:"version"`
}

// Policy is what the approval policy sees of a call.
type Policy struct {
	// Amount and Currency are JSON pointers into the arguments: the
	// amount (an integer in minor units) and its ISO 4217 currency.
	Amount   string `toml:"amount"`
	Currency string `toml:"currency"`
	// Recipient is a JSON pointer to who the operation is for, shown to
	// approvers.
	Recipient string `toml:"recipient"`
	// AlwaysApprove: every call needs a human approver.
	AlwaysApprove bool `toml:"always_approve"`
	// ApprovalThresholdMinor: a call whose amount is at or above it needs
	// approval (0: no amount rule).
	ApprovalThresholdMinor int64 `toml:"approval_threshold_minor"`
}

// Secret is where one secret comes from: an environment variable, or a
// file (relative to the declaring file; its content trimmed).
type Secret struct {
	Env  string `toml:"env"`
	File string `toml:"file"`
}

// Bounds on declarations.
const (
	maxFileBytes    = 1 << 20
	maxTools        = 200
	maxDescription  = 4000
	maxTemplate     = 2048
	defaultTimeout  = 10 * time.Second
	maxSecretBytes  = 16 << 10
	maxHeaders      = 32
	maxBodyFields   = 100
	maxDirEntries   = 1000
	maxTitle        = 200
	maxNoun         = 64
	maxPointerBytes = 256
)

var nameRE = regexp.MustCompile(`^[a-z][a-z0-9_]{0,63}$`)

// Parse reads a file of declarations (TOML, [[tools]] only; unknown keys
// are an error naming them). path names it in errors and is where
// relative file names in it are resolved from.
func Parse(data []byte, path string) ([]Decl, error) {
	if len(data) > maxFileBytes {
		return nil, fmt.Errorf("%s: larger than 1 MiB", path)
	}
	var f File
	md, err := toml.Decode(string(data), &f)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if un := md.Undecoded(); len(un) > 0 {
		keys := make([]string, len(un))
		for i, k := range un {
			keys[i] = k.String()
		}
		return nil, fmt.Errorf("%s: unknown keys %s", path, strings.Join(keys, ", "))
	}
	Locate(f.Tools, filepath.Dir(path))
	return f.Tools, nil
}

// Locate records dir as where the relative file names of ds are resolved
// from (for declarations decoded as part of another file).
func Locate(ds []Decl, dir string) {
	for i := range ds {
		ds[i].dir = dir
	}
}

// LoadDir reads every *.toml file of dir (not its subdirectories), in
// name order.
func LoadDir(dir string) ([]Decl, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("tools directory: %w", err)
	}
	if len(entries) > maxDirEntries {
		return nil, fmt.Errorf("tools directory %s: more than %d entries", dir, maxDirEntries)
	}
	var out []Decl
	for _, e := range entries {
		if e.IsDir() || !strings.HasSuffix(e.Name(), ".toml") {
			continue
		}
		path := filepath.Join(dir, e.Name())
		b, err := readBounded(path, maxFileBytes)
		if err != nil {
			return nil, err
		}
		ds, err := Parse(b, path)
		if err != nil {
			return nil, err
		}
		out = append(out, ds...)
	}
	return out, nil
}

func readBounded(path string, limit int64) ([]byte, error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	if !st.Mode().IsRegular() {
		return nil, fmt.Errorf("%s: not a regular file", path)
	}
	if st.Size() > limit {
		return nil, fmt.Errorf("%s: larger than %d bytes", path, limit)
	}
	return os.ReadFile(path)
}

// Environ reads an environment variable (os.LookupEnv, or a test's).
type Environ func(name string) (string, bool)

// Build checks every declaration and returns the tools, in the order
// given. Every problem of every declaration is reported, each prefixed by
// its tool. reserved are names already taken (the built-in tools). env
// reads the environment for secrets; nil reads no secret at all (each is
// empty): for a process that only reads the ledger and sends nothing.
func Build(ds []Decl, reserved []string, env Environ) ([]*Tool, error) {
	if len(ds) > maxTools {
		return nil, fmt.Errorf("more than %d declared tools", maxTools)
	}
	var errs []error
	seen := map[string]bool{}
	var out []*Tool
	for i, d := range ds {
		label := d.Name
		if label == "" {
			label = "#" + strconv.Itoa(i+1)
		}
		if seen[d.Name] {
			errs = append(errs, fmt.Errorf("tool %s: declared twice", label))
			continue
		}
		seen[d.Name] = true
		if slices.Contains(reserved, d.Name) {
			errs = append(errs, fmt.Errorf("tool %s: the name of a built-in tool; choose another", label))
			continue
		}
		t, err := build(d, env)
		if err != nil {
			errs = append(errs, fmt.Errorf("tool %s: %w", label, err))
			continue
		}
		out = append(out, t)
	}
	return out, errors.Join(errs...)
}

// problems collects a declaration's problems.
type problems []string

func (p *problems) add(format string, args ...any) { *p = append(*p, fmt.Sprintf(format, args...)) }

func (p problems) err() error {
	if len(p) == 0 {
		return nil
	}
	sort.Strings(p)
	return errors.New(strings.Join(p, "; "))
}

// readSchema is the declaration's input schema text.
func (d *Decl) readSchema() ([]byte, error) {
	switch {
	case d.InputSchema != "" && d.InputSchemaFile != "":
		return nil, errors.New("input_schema and input_schema_file: give one")
	case d.InputSchema != "":
		return []byte(d.InputSchema), nil
	case d.InputSchemaFile != "":
		return readBounded(d.resolve(d.InputSchemaFile), 64<<10)
	}
	return nil, errors.New("input_schema (or input_schema_file) is required")
}

func (d *Decl) resolve(name string) string {
	if filepath.IsAbs(name) || d.dir == "" {
		return name
	}
	return filepath.Join(d.dir, name)
}

// secrets reads the declaration's secrets.
func (d *Decl) secrets(env Environ, p *problems) map[string]string {
	out := map[string]string{}
	for name, s := range d.Secrets {
		switch {
		case env == nil:
			out[name] = "" // a reader sends nothing
		case s.Env != "" && s.File != "":
			p.add("secrets.%s: env and file: give one", name)
		case s.Env != "":
			v, ok := env(s.Env)
			if !ok || v == "" {
				p.add("secrets.%s: the environment variable %s is not set", name, s.Env)
				continue
			}
			out[name] = v
		case s.File != "":
			b, err := readBounded(d.resolve(s.File), maxSecretBytes)
			if err != nil {
				p.add("secrets.%s: %v", name, err)
				continue
			}
			v := strings.TrimSpace(string(b))
			if v == "" {
				p.add("secrets.%s: the file %s is empty", name, s.File)
				continue
			}
			out[name] = v
		default:
			p.add("secrets.%s: name env or file", name)
		}
	}
	return out
}

// overrides is the declaration's status classification overrides.
func (o Outcome) overrides(p *problems) map[int]string {
	m := map[int]string{}
	for class, statuses := range map[string][]int{orders.Definitive: o.Definitive, orders.NotSent: o.NotSent, orders.Indeterminate: o.Indeterminate} {
		for _, s := range statuses {
			if s < 300 || s > 599 {
				p.add("outcome.%s: %d is not an HTTP status from 300 to 599 (a 2xx is the answer)", class, s)
				continue
			}
			if prev, dup := m[s]; dup {
				p.add("outcome: status %d is both %s and %s", s, prev, class)
			}
			m[s] = class
		}
	}
	return m
}

// checkPointer reports a JSON pointer that is not one.
func checkPointer(p *problems, key, ptr string, required bool) {
	switch {
	case ptr == "" && required:
		p.add("%s: a JSON pointer is required (e.g. \"/amount_minor\")", key)
	case ptr != "" && (!strings.HasPrefix(ptr, "/") || len(ptr) > maxPointerBytes):
		p.add("%s: %q is not a JSON pointer (\"/field\", at most %d bytes)", key, ptr, maxPointerBytes)
	}
}

// schemaProps is what templates and pointers may refer to in an input
// schema: each top-level property's type and whether it is required.
type schemaProps map[string]struct {
	typ      string
	required bool
}

// Digest summarises declarations as a process running them has them:
// the declarations themselves, the schema files and the secrets they
// name (hashed), so two processes can tell whether they run the same
// tools. Unreadable parts count as empty.
func Digest(ds []Decl, env Environ) string {
	if env == nil {
		env = os.LookupEnv
	}
	h := sha256.New()
	b, _ := json.Marshal(ds)
	h.Write(b)
	for _, d := range ds {
		if d.InputSchemaFile != "" {
			b, _ := readBounded(d.resolve(d.InputSchemaFile), 64<<10)
			h.Write(b)
		}
		names := make([]string, 0, len(d.Secrets))
		for n := range d.Secrets {
			names = append(names, n)
		}
		sort.Strings(names)
		for _, n := range names {
			s := d.Secrets[n]
			if s.Env != "" {
				v, _ := env(s.Env)
				h.Write([]byte(n + "=env:" + v + "\x00"))
			} else {
				b, _ := readBounded(d.resolve(s.File), maxSecretBytes)
				h.Write([]byte(n + "=file:"))
				h.Write(b)
				h.Write([]byte{0})
			}
		}
	}
	return hex.EncodeToString(h.Sum(nil)[:8])
}

// LongestTimeout is the longest request timeout of ds (their default
// when they name none; 0 for no declarations).
func LongestTimeout(ds []Decl) time.Duration {
	var longest time.Duration
	for _, d := range ds {
		t := d.Timeout.Duration
		if t <= 0 {
			t = defaultTimeout
		}
		longest = max(longest, t)
	}
	return longest
}
