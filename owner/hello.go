package owner

import (
	"bufio"
	"bytes"
	"debug/elf"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"os"
	"runtime/debug"
	"slices"
	"strings"
	"sync"
	"time"
)

// protocol is the version of the hello; an owner refuses another.
const protocol = 1

// maxHello bounds a hello or a welcome line.
const maxHello = 64 << 10

// helloTimeout bounds the exchange of hello and welcome.
const helloTimeout = 5 * time.Second

// Hello is the first line a client sends on a connection: who it is, the
// build it runs and the configuration it was started with. After the
// owner's Welcome, the connection carries the client's MCP messages.
type Hello struct {
	Protocol int    `json:"idemgate_owner_protocol"`
	Build    string `json:"build"`
	PID      int    `json:"pid"`
	// Config is the client's configuration, flag by flag (see
	// Differences); the owner refuses a client whose configuration
	// differs from its own.
	Config map[string]string `json:"config"`
	// Who the client acts as: its flags' or its token's.
	Principal  string `json:"principal"`
	Tenant     string `json:"tenant"`
	Role       string `json:"role"`
	OnBehalfOf string `json:"on_behalf_of,omitempty"`
	Model      string `json:"model,omitempty"`
	// TokenVerified: the identity is a token's from the tokens file,
	// which the client checked (the owner accepts only its own user).
	TokenVerified bool `json:"token_verified,omitempty"`
	// Workers bounds the client's concurrent tool calls.
	Workers int `json:"workers"`
	// Command, when set, is an idemgate command for the owner to run over
	// its ledger instead of serving MCP messages (see Output and Relay):
	// its words, its flags and its arguments, paths made absolute. Config
	// then holds only the settings the command was given; the owner
	// compares those.
	Command []string `json:"command,omitempty"`
	// Env is the client's environment for Command: the IDEMGATE_
	// variables that give its flags their defaults.
	Env map[string]string `json:"env,omitempty"`
}

// Welcome is the owner's answer to a hello: OK, or the reason it refuses
// the client, in words for a person.
type Welcome struct {
	OK    bool   `json:"ok"`
	PID   int    `json:"pid"`
	Build string `json:"build"`
	Error string `json:"error,omitempty"`
	// Leaving: the owner refused the client for its build or
	// configuration, had no other client, and is exiting so that the
	// client can start an owner of its own build and configuration.
	Leaving bool `json:"leaving,omitempty"`
}

// errSilent: the other end said nothing within helloTimeout (a stopped or
// hung process).
var errSilent = errors.New("no answer")

// Send writes v as one line on c within helloTimeout.
func Send(c net.Conn, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	c.SetWriteDeadline(time.Now().Add(helloTimeout))
	defer c.SetWriteDeadline(time.Time{})
	_, err = c.Write(append(b, '\n'))
	return err
}

// Receive reads one line of at most maxHello bytes from r (reading c)
// within helloTimeout, into v.
func Receive(c net.Conn, r *bufio.Reader, v any) error {
	c.SetReadDeadline(time.Now().Add(helloTimeout))
	defer c.SetReadDeadline(time.Time{})
	var line []byte
	for {
		chunk, err := r.ReadSlice('\n')
		line = append(line, chunk...)
		if len(line) > maxHello {
			return fmt.Errorf("a hello line over %d bytes", maxHello)
		}
		if errors.Is(err, bufio.ErrBufferFull) {
			continue
		}
		if err != nil {
			if errors.Is(err, os.ErrDeadlineExceeded) {
				return fmt.Errorf("%w within %s", errSilent, helloTimeout)
			}
			if errors.Is(err, io.EOF) {
				return io.ErrUnexpectedEOF
			}
			return err
		}
		break
	}
	dec := json.NewDecoder(bytes.NewReader(line))
	dec.DisallowUnknownFields()
	return dec.Decode(v)
}

// Differences lists, in words, the settings in which a client's
// configuration (mine) differs from the owner's (theirs): one item per
// setting, sorted.
func Differences(mine, theirs map[string]string) []string {
	var out []string
	for k, v := range mine {
		if w, ok := theirs[k]; !ok {
			out = append(out, fmt.Sprintf("%s is %q here, unknown to the owner", k, v))
		} else if w != v {
			out = append(out, fmt.Sprintf("%s is %q here, %q in the owner", k, v, w))
		}
	}
	for k, w := range theirs {
		if _, ok := mine[k]; !ok {
			out = append(out, fmt.Sprintf("%s is %q in the owner, unknown here", k, w))
		}
	}
	slices.Sort(out)
	return out
}

// Check is the owner's verdict on a hello: nil, or why it refuses it, in
// one line that says what differs and what to do. build and config are
// the owner's own.
func Check(h Hello, build string, config map[string]string, ledger string) error {
	if h.Protocol != protocol {
		return fmt.Errorf("the owner of ledger %s (pid %d) speaks owner protocol %d, this idemgate %d: stop the older one and start again", ledger, os.Getpid(), protocol, h.Protocol)
	}
	if h.Build != build {
		return fmt.Errorf("the owner of ledger %s (pid %d) runs another build of idemgate (%s; this one is %s): end the MCP clients still running the other build (the owner exits a minute after its last client leaves) or stop it (kill %d), then start again", ledger, os.Getpid(), short(build), short(h.Build), os.Getpid())
	}
	if len(h.Command) > 0 && h.Command[0] != "serve" {
		// A command compares the settings it was given (a serve all
		// of them).
		config = maps.Clone(config)
		maps.DeleteFunc(config, func(k, _ string) bool { _, ok := h.Config[k]; return !ok })
		if d := Differences(h.Config, config); len(d) > 0 {
			return fmt.Errorf("the owner of ledger %s (pid %d), which runs %s for this process, was started with another configuration: %s; leave these settings out (the command uses the owner's) or stop the owner (kill %d) once its clients have ended", ledger, os.Getpid(), h.Command[0], strings.Join(d, "; "), os.Getpid())
		}
		return nil
	}
	if d := Differences(h.Config, config); len(d) > 0 {
		return fmt.Errorf("the owner of ledger %s (pid %d) was started with another configuration: %s; give every idemgate serve on this ledger the same configuration, or stop the owner (kill %d) once its clients have ended", ledger, os.Getpid(), strings.Join(d, "; "), os.Getpid())
	}
	return nil
}

func short(build string) string {
	if len(build) > 12 {
		return build[len(build)-12:]
	}
	return build
}

// Build identifies this executable: Go's build ID, which changes with any
// change to the program, from the running file's ELF note; else the
// module's version and the file's size and time.
var Build = sync.OnceValue(func() string {
	exe, err := os.Executable()
	if err != nil {
		return "unknown"
	}
	if f, err := elf.Open(exe); err == nil {
		defer f.Close()
		if s := f.Section(".note.go.buildid"); s != nil {
			if b, err := s.Data(); err == nil && len(b) > 16 {
				// A note: namesz, descsz, type (4 bytes each), "Go\0\0", the ID.
				return strings.TrimRight(string(b[16:]), "\x00")
			}
		}
	}
	v := "devel"
	if bi, ok := debug.ReadBuildInfo(); ok {
		v = bi.Main.Version
	}
	if fi, err := os.Stat(exe); err == nil {
		v += fmt.Sprintf("-%d-%d", fi.Size(), fi.ModTime().UnixNano())
	}
	return v
})
