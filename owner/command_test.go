package owner

import (
	"bytes"
	"errors"
	"io"
	"net"
	"strings"
	"testing"
)

// TestRelay: what a command writes on either stream arrives on that
// stream, in order, a write longer than a frame included, and its exit
// status ends the relay.
func TestRelay(t *testing.T) {
	a, b := net.Pipe()
	big := strings.Repeat("x", maxFrame+10)
	go func() {
		out := NewOutput(a)
		io.WriteString(out.Stdout(), "one\n")
		io.WriteString(out.Stderr(), "warning\n")
		io.WriteString(out.Stdout(), big)
		out.Exit(3)
		a.Close()
	}()
	var stdout, stderr bytes.Buffer
	code, err := Relay(b, &stdout, &stderr)
	if err != nil || code != 3 {
		t.Fatalf("Relay: %d, %v; want 3, nil", code, err)
	}
	if stdout.String() != "one\n"+big || stderr.String() != "warning\n" {
		t.Errorf("stdout %d bytes, stderr %q", stdout.Len(), stderr.String())
	}
}

// TestRelayOwnerGone: a connection that ends before the exit status, even
// inside a frame, is ErrOwnerGone; a frame of an unknown kind or over the
// bound is an error.
func TestRelayOwnerGone(t *testing.T) {
	for name, raw := range map[string][]byte{
		"nothing":     {},
		"after text":  append([]byte{frameStdout, 0, 0, 0, 2}, "ok"...),
		"mid frame":   append([]byte{frameStdout, 0, 0, 0, 9}, "cut"...),
		"mid exit":    {frameExit, 0, 0, 0, 4, 0},
		"mid header":  {frameStderr, 0},
		"unknown":     {'?', 0, 0, 0, 0},
		"too long":    {frameStdout, 0xff, 0, 0, 0},
		"bad exit":    {frameExit, 0, 0, 0, 1, 7},
		"negative ok": {frameExit, 0, 0, 0, 4, 0xff, 0xff, 0xff, 0xff},
	} {
		code, err := Relay(bytes.NewReader(raw), io.Discard, io.Discard)
		switch name {
		case "nothing", "after text", "mid frame", "mid exit", "mid header":
			if !errors.Is(err, ErrOwnerGone) {
				t.Errorf("%s: %d, %v; want ErrOwnerGone", name, code, err)
			}
		case "negative ok":
			if err != nil || code != -1 {
				t.Errorf("%s: %d, %v; want -1", name, code, err)
			}
		default:
			if err == nil || errors.Is(err, ErrOwnerGone) {
				t.Errorf("%s: %d, %v; want an error of the frame", name, code, err)
			}
		}
	}
}

// FuzzRelay: any bytes from a connection end the relay with a status or an
// error, never a panic, and write no more than they carry.
func FuzzRelay(f *testing.F) {
	f.Add(append([]byte{frameStdout, 0, 0, 0, 2}, "ok"...))
	f.Add([]byte{frameExit, 0, 0, 0, 4, 0, 0, 0, 1})
	f.Add([]byte{frameStderr, 0, 0, 0, 9, 'a'})
	f.Fuzz(func(t *testing.T, raw []byte) {
		var out bytes.Buffer
		Relay(bytes.NewReader(raw), &out, &out)
		if out.Len() > len(raw) {
			t.Fatalf("%d bytes written from %d read", out.Len(), len(raw))
		}
	})
}
