package loadgen

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/mark3labs/mcp-go/client"
	"github.com/mark3labs/mcp-go/client/transport"
	"github.com/mark3labs/mcp-go/mcp"
)

// Client is an mcp-go client as a Caller. Close it when done.
type Client struct {
	c   *client.Client
	cmd *exec.Cmd // the spawned server, for stdio
}

// Call calls tool with args and returns its answer.
func (c *Client) Call(ctx context.Context, tool string, args map[string]any) (Answer, error) {
	req := mcp.CallToolRequest{}
	req.Params.Name = tool
	req.Params.Arguments = args
	res, err := c.c.CallTool(ctx, req)
	if err != nil {
		return Answer{}, err
	}
	a := Answer{IsError: res.IsError, Structured: res.RawStructuredContent}
	if len(a.Structured) == 0 && res.StructuredContent != nil {
		if a.Structured, err = json.Marshal(res.StructuredContent); err != nil {
			return Answer{}, err
		}
	}
	return a, nil
}

// PID is the spawned server's process id (0 over HTTP).
func (c *Client) PID() int {
	if c.cmd == nil || c.cmd.Process == nil {
		return 0
	}
	return c.cmd.Process.Pid
}

// Close ends the connection; a spawned server sees its stdin close and
// exits, and Close waits up to 10 s for it, then kills it.
func (c *Client) Close() error {
	err := c.c.Close()
	if c.cmd != nil && c.cmd.Process != nil {
		done := make(chan struct{})
		go func() {
			_ = c.cmd.Wait()
			close(done)
		}()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = c.cmd.Process.Kill()
			<-done
		}
	}
	return err
}

func initialize(ctx context.Context, c *client.Client) error {
	req := mcp.InitializeRequest{}
	req.Params.ClientInfo = mcp.Implementation{Name: "idemgate-bench", Version: "1"}
	req.Params.ProtocolVersion = mcp.LATEST_PROTOCOL_VERSION
	_, err := c.Initialize(ctx, req)
	return err
}

// SpawnStdio starts bin with args as an MCP stdio server (its stderr goes
// to stderr), in a process group of its own, and connects to it.
func SpawnStdio(ctx context.Context, bin string, args []string, stderr io.Writer) (*Client, error) {
	cl := &Client{}
	tr := transport.NewStdioWithOptions(bin, nil, args,
		transport.WithCommandStderrWriter(stderr),
		transport.WithCommandFunc(func(_ context.Context, command string, env, args []string) (*exec.Cmd, error) {
			cmd := exec.Command(command, args...)
			cmd.Env = append(os.Environ(), env...)
			// Its own process group: a Ctrl-C at the terminal stops the
			// load generator, which then lets the calls in flight finish
			// and closes the server's stdin; the server need not see the
			// signal and start shutting down under them.
			cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
			cl.cmd = cmd
			return cmd, nil
		}))
	c := client.NewClient(tr)
	// The stdio transport keeps the context it starts with for the
	// connection's lifetime.
	if err := c.Start(context.Background()); err != nil {
		return nil, fmt.Errorf("starting the server %s: %w", bin, err)
	}
	cl.c = c
	if err := initialize(ctx, c); err != nil {
		cl.Close()
		return nil, fmt.Errorf("the spawned server (%s %s) did not answer initialize (its own error, if any, is above): %w", bin, strings.Join(args, " "), err)
	}
	return cl, nil
}

// Server is a server process started to be called over HTTP (the no-op
// floor of an HTTP run). Close it when done.
type Server struct {
	URL   string // its MCP endpoint
	cmd   *exec.Cmd
	stdin io.WriteCloser
	done  chan struct{}
}

// SpawnHTTP starts bin with args (its stderr goes to stderr), in a process
// group of its own, as a server that prints the URL of its MCP endpoint as
// the first line of its stdout and serves until its stdin closes; it
// returns once that line came, within 10 s.
func SpawnHTTP(bin string, args []string, stderr io.Writer) (*Server, error) {
	cmd := exec.Command(bin, args...)
	cmd.Stderr = stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true} // see SpawnStdio
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting %s: %w", bin, err)
	}
	s := &Server{cmd: cmd, stdin: stdin, done: make(chan struct{})}
	line := make(chan string, 1)
	go func() {
		r := bufio.NewReader(stdout)
		l, _ := r.ReadString('\n')
		line <- strings.TrimSpace(l)
		_, _ = io.Copy(io.Discard, r) // until it exits: Wait only after every read
		_ = cmd.Wait()
		close(s.done)
	}()
	select {
	case s.URL = <-line:
	case <-time.After(10 * time.Second):
	}
	if !strings.HasPrefix(s.URL, "http://") {
		s.Close()
		return nil, fmt.Errorf("%s %s did not print its URL within 10 s (its own error, if any, is above)", bin, strings.Join(args, " "))
	}
	return s, nil
}

// PID is the server's process id.
func (s *Server) PID() int { return s.cmd.Process.Pid }

// Close closes the server's stdin and waits up to 10 s for it to exit,
// then kills it.
func (s *Server) Close() error {
	err := s.stdin.Close()
	select {
	case <-s.done:
	case <-time.After(10 * time.Second):
		_ = s.cmd.Process.Kill()
		<-s.done
	}
	return err
}

// DialHTTP connects to a Streamable HTTP MCP endpoint with a bearer
// token, through hc (nil: a client of its own).
func DialHTTP(ctx context.Context, url, token string, hc *http.Client) (*Client, error) {
	opts := []transport.StreamableHTTPCOption{transport.WithHTTPTimeout(60 * time.Second)}
	if hc != nil {
		opts = append(opts, transport.WithHTTPBasicClient(hc))
	}
	if token != "" {
		opts = append(opts, transport.WithHTTPHeaders(map[string]string{"Authorization": "Bearer " + token}))
	}
	tr, err := transport.NewStreamableHTTP(url, opts...)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", url, err)
	}
	c := client.NewClient(tr)
	if err := c.Start(context.Background()); err != nil {
		return nil, fmt.Errorf("%s: %w", url, err)
	}
	if err := initialize(ctx, c); err != nil {
		c.Close()
		return nil, fmt.Errorf("--url %s: the server did not answer initialize (is it running, and is this its MCP endpoint and the token one of its --tokens?): %w", url, err)
	}
	return &Client{c: c}, nil
}

// userHZ is the unit of utime and stime in /proc/PID/stat: USER_HZ, 100
// on Linux (fixed by the kernel's user-space ABI).
const userHZ = 100

// ProcessCPU is the CPU time (user + system) process pid has used, read
// from /proc/PID/stat (Linux only; the resolution is 10 ms).
func ProcessCPU(pid int) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	_, used, err := parseStatCPU(string(b), false)
	return used, err
}

// CommandCPU is the CPU time used by every process named comm and by
// their children that have ended (a PostgreSQL server's backends that
// exited count in their postmaster's), read from /proc (Linux only; 0
// elsewhere).
func CommandCPU(comm string) time.Duration {
	paths, _ := filepath.Glob("/proc/[0-9]*/stat")
	var sum time.Duration
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil {
			continue // ended meanwhile
		}
		if name, used, err := parseStatCPU(string(b), true); err == nil && name == comm {
			sum += used
		}
	}
	return sum
}

// MachineBusy is the CPU time every CPU of this machine has spent since
// boot neither idle, nor waiting for I/O, nor stolen by a hypervisor
// (/proc/stat; Linux only, 0 elsewhere).
func MachineBusy() time.Duration {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line) // cpu user nice system idle iowait irq softirq steal …
	var ticks int64
	for _, i := range []int{1, 2, 3, 6, 7} { // user nice system irq softirq
		if i < len(f) {
			n, _ := strconv.ParseInt(f[i], 10, 64)
			ticks += n
		}
	}
	return time.Duration(ticks) * time.Second / userHZ
}

// parseStatCPU reads the command name (field 2) and utime and stime
// (fields 14 and 15; with children, also cutime and cstime, 16 and 17) of
// a /proc/PID/stat line; the command name may hold spaces and
// parentheses, so the fields are counted from its last ')'.
func parseStatCPU(stat string, children bool) (string, time.Duration, error) {
	open, i := strings.IndexByte(stat, '('), strings.LastIndexByte(stat, ')')
	if open < 0 || i < open {
		return "", 0, errors.New("/proc stat: no command name")
	}
	f := strings.Fields(stat[i+1:])
	// f[0] is field 3 (state); utime is field 14.
	last := 12
	if children {
		last = 14
	}
	if len(f) <= last {
		return "", 0, errors.New("/proc stat: too few fields")
	}
	var ticks int64
	for _, v := range f[11 : last+1] {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 0 {
			return "", 0, fmt.Errorf("/proc stat: %q is not a tick count", v)
		}
		ticks += n
	}
	return stat[open+1 : i], time.Duration(ticks) * time.Second / userHZ, nil
}
