package main

import (
	"flag"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestNotifySettings: [approvals] notify_webhook needs [console]
// public_url, which must be an http(s) URL with a host; the flags
// override the file; a typo in the sections is an error naming it.
func TestNotifySettings(t *testing.T) {
	tests := []struct {
		name, file string
		args       []string
		wantErr    string // "" for none
		webhook    string
		publicURL  string
	}{
		{name: "nothing set"},
		{name: "file", file: "[approvals]\nnotify_webhook = \"https://relay.example/h\"\n[console]\npublic_url = \"https://gate.example.com/\"\n",
			webhook: "https://relay.example/h", publicURL: "https://gate.example.com"},
		{name: "flags", args: []string{"--approval-notify-webhook", "https://relay.example/h", "--public-url", "http://127.0.0.1:8080"},
			webhook: "https://relay.example/h", publicURL: "http://127.0.0.1:8080"},
		{name: "flag overrides file", file: "[console]\npublic_url = \"https://old.example\"\n", args: []string{"--public-url", "https://new.example/gate"},
			publicURL: "https://new.example/gate"},
		{name: "webhook without public URL", args: []string{"--approval-notify-webhook", "https://relay.example/h"},
			wantErr: "needs [console] public_url"},
		{name: "public URL without host", args: []string{"--public-url", "https://"}, wantErr: "no host"},
		{name: "public URL with a query", args: []string{"--public-url", "https://gate.example.com/?x=1"}, wantErr: "query"},
		{name: "typo in [approvals]", file: "[approvals]\nnotify_webhok = \"https://relay.example/h\"\n", wantErr: "approvals.notify_webhok"},
	}
	for _, name := range []string{"IDEMGATE_APPROVAL_NOTIFY_WEBHOOK", "IDEMGATE_APPROVAL_NOTIFY_SECRET", "IDEMGATE_PUBLIC_URL", "IDEMGATE_CONFIG"} {
		t.Setenv(name, "")
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var l settings
			fs := flag.NewFlagSet("serve", flag.ContinueOnError)
			fs.SetOutput(io.Discard)
			l.register(fs)
			args := tc.args
			if tc.file != "" {
				f := filepath.Join(t.TempDir(), "idemgate.toml")
				if err := os.WriteFile(f, []byte(tc.file), 0o600); err != nil {
					t.Fatal(err)
				}
				args = append([]string{"--config", f}, args...)
			}
			if err := fs.Parse(args); err != nil {
				t.Fatal(err)
			}
			err := l.load()
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("load: %v, want an error containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("load: %v", err)
			}
			if l.file.Approvals.NotifyWebhook != tc.webhook || l.file.Console.PublicURL != tc.publicURL {
				t.Errorf("notify_webhook %q, public_url %q; want %q, %q", l.file.Approvals.NotifyWebhook, l.file.Console.PublicURL, tc.webhook, tc.publicURL)
			}
		})
	}
}
