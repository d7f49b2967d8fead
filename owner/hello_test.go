package owner

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"slices"
	"strings"
	"testing"
)

func TestDifferences(t *testing.T) {
	for _, tc := range []struct {
		name         string
		mine, theirs map[string]string
		want         []string
	}{
		{"same", map[string]string{"--a": "1", "--b": ""}, map[string]string{"--b": "", "--a": "1"}, nil},
		{"none", nil, map[string]string{}, nil},
		{"each way", map[string]string{"--a": "1", "--b": "2", "--c": "3"}, map[string]string{"--a": "1", "--b": "9", "--d": "4"}, []string{
			`--b is "2" here, "9" in the owner`,
			`--c is "3" here, unknown to the owner`,
			`--d is "4" in the owner, unknown here`,
		}},
		{"empty is a value", map[string]string{"--a": ""}, nil, []string{`--a is "" here, unknown to the owner`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := Differences(tc.mine, tc.theirs); !slices.Equal(got, tc.want) {
				t.Errorf("got %q, want %q", got, tc.want)
			}
		})
	}
}

func TestCheck(t *testing.T) {
	const (
		build  = "owner-build/0123456789ab"
		ledger = "/data/ledger.db"
	)
	config := map[string]string{"--policy": "p.yaml", "--workers": "4"}
	pid := fmt.Sprintf("(pid %d)", os.Getpid())
	ok := Hello{Protocol: protocol, Build: build, Config: map[string]string{"--workers": "4", "--policy": "p.yaml"}}
	if err := Check(ok, build, config, ledger); err != nil {
		t.Errorf("Check of a hello of the same build and configuration: %v", err)
	}
	for _, tc := range []struct {
		name string
		h    Hello
		want []string // in the message
	}{
		{"protocol", Hello{Protocol: protocol + 1, Build: "other", Config: map[string]string{}},
			[]string{"the owner of ledger " + ledger + " " + pid, fmt.Sprintf("speaks owner protocol %d, this idemgate %d", protocol, protocol+1), "stop the older one"}},
		{"build", Hello{Protocol: protocol, Build: "client-build/ba9876543210", Config: config},
			[]string{"the owner of ledger " + ledger + " " + pid, "another build of idemgate (0123456789ab; this one is ba9876543210)", fmt.Sprintf("kill %d", os.Getpid())}},
		{"configuration", Hello{Protocol: protocol, Build: build, Config: map[string]string{"--policy": "q.yaml", "--verbose": "true"}},
			[]string{"the owner of ledger " + ledger + " " + pid, "another configuration: ",
				`--policy is "q.yaml" here, "p.yaml" in the owner; --verbose is "true" here, unknown to the owner; --workers is "4" in the owner, unknown here;`,
				"give every idemgate serve on this ledger the same configuration"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := Check(tc.h, build, config, ledger)
			if err == nil {
				t.Fatal("Check accepted the hello")
			}
			msg := err.Error()
			if strings.Contains(msg, "\n") {
				t.Errorf("the refusal is more than one line: %q", msg)
			}
			for _, w := range tc.want {
				if !strings.Contains(msg, w) {
					t.Errorf("the refusal %q does not say %q", msg, w)
				}
			}
		})
	}
}

// FuzzReceiveHello: any bytes a client sends as its hello are refused
// with an error or decoded into a Hello that Check then judges, without a
// panic, and a decoded hello never passes Check against another build.
func FuzzReceiveHello(f *testing.F) {
	f.Add([]byte(`{"idemgate_owner_protocol":1,"build":"b","pid":1,"config":{"--wait":"5s"},"principal":"p","tenant":"t","role":"agent","workers":8}` + "\n"))
	f.Add([]byte("{}\n"))
	f.Add([]byte(`{"config":{"a":1}}` + "\n"))
	f.Add([]byte("not json\n"))
	f.Add([]byte(`{"idemgate_owner_protocol":1,"unknown":true}` + "\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		client, server := net.Pipe()
		defer client.Close()
		defer server.Close()
		go func() {
			client.Write(b)
			client.Close()
		}()
		var h Hello
		if err := Receive(server, bufio.NewReader(server), &h); err != nil {
			return
		}
		if Check(h, "another build", map[string]string{"--wait": "5s"}, "/ledger.db") == nil {
			t.Fatalf("a hello of build %q passed the check of another build", h.Build)
		}
	})
}
