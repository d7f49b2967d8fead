package owner

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strings"
	"time"
)

// The last line an owner writes on its standard error when it has started
// (Ready) or found another owner (Elsewhere); it then writes nothing more
// there (its log goes to its Place's Log).
const (
	Ready     = "idemgate-owner: ready"
	Elsewhere = "idemgate-owner: another process owns this ledger"
)

// startTimeout bounds an owner's start: opening and checking the ledger.
const startTimeout = time.Minute

// Start starts an owner: exe with args, detached (a session of its own, so
// it survives the client's process group, standard input and output on
// the null device). It returns once the owner listens, or another process
// turned out to own the ledger; when the owner fails to start, the error
// holds what it wrote (its reason, e.g. a damaged ledger).
func Start(exe string, args []string, env []string) error {
	r, w, err := os.Pipe()
	if err != nil {
		return err
	}
	null, err := os.OpenFile(os.DevNull, os.O_RDWR, 0)
	if err != nil {
		r.Close()
		w.Close()
		return err
	}
	defer null.Close()
	cmd := exec.Command(exe, args...)
	cmd.Env = env
	cmd.Stdin, cmd.Stdout, cmd.Stderr = null, null, w
	cmd.SysProcAttr = detached()
	err = cmd.Start()
	w.Close()
	if err != nil {
		r.Close()
		return fmt.Errorf("starting the ledger's owner: %w", err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }() // reaps it if it ends while we live
	said := readUntilClosed(r, startTimeout)
	r.Close()
	lines := strings.Split(strings.TrimSpace(string(said)), "\n")
	switch last := lines[len(lines)-1]; last {
	case Ready, Elsewhere:
		return nil
	}
	select {
	case err := <-exited:
		// What it wrote is the reason, which the client reports as its own.
		if msg := strings.TrimPrefix(strings.TrimSpace(string(said)), "idemgate: "); msg != "" {
			return errors.New(msg)
		}
		return fmt.Errorf("the ledger's owner (%s) ended as it started: %v", exe, err)
	case <-time.After(time.Second):
		return fmt.Errorf("the ledger's owner (pid %d) did not start within %s: %s", cmd.Process.Pid, startTimeout, strings.TrimSpace(string(said)))
	}
}

// readUntilClosed reads r until its writers close it or timeout passes,
// keeping the last 32 KiB or more.
func readUntilClosed(r *os.File, timeout time.Duration) []byte {
	r.SetReadDeadline(time.Now().Add(timeout))
	var out []byte
	chunk := make([]byte, 4096)
	for {
		n, err := r.Read(chunk)
		if out = append(out, chunk[:n]...); len(out) > 64<<10 {
			out = slices.Clone(out[len(out)-32<<10:])
		}
		if err != nil {
			return out
		}
	}
}
