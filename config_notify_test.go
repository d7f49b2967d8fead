package main

import (
	"context"
	"flag"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"idemgate/ledger"
	"idemgate/outbox"
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

// TestOutboxFormatSettings: [notifications] outbox_format picks the
// outbox directory's format — files unless set, the flag over the file —
// and the service writes there: one <message_id>.json per message, or a
// line per message in segments/, nothing else. An unknown format, or
// segments with a webhook, is an error.
func TestOutboxFormatSettings(t *testing.T) {
	t.Setenv("IDEMGATE_OUTBOX_FORMAT", "")
	t.Setenv("IDEMGATE_NOTIFY_WEBHOOK", "")
	t.Setenv("IDEMGATE_CONFIG", "")
	for _, tc := range []struct {
		name, file string
		args       []string
		want       string // the format, or the error
	}{
		{name: "default", want: outboxFiles},
		{name: "file", file: "[notifications]\noutbox_format = \"segments\"\n", want: outboxSegments},
		{name: "flag over file", file: "[notifications]\noutbox_format = \"segments\"\n", args: []string{"--outbox-format", "files"}, want: outboxFiles},
		{name: "unknown", args: []string{"--outbox-format", "lines"}, want: "want files or segments"},
		{name: "segments with a webhook", args: []string{"--outbox-format", "segments", "--notify-webhook", "https://gw.example/m"}, want: "set one of them"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			var l settings
			fs := flag.NewFlagSet("serve", flag.ContinueOnError)
			fs.SetOutput(io.Discard)
			l.register(fs)
			args := append([]string{"--db", filepath.Join(dir, "ledger.db")}, tc.args...)
			if tc.file != "" {
				f := filepath.Join(dir, "idemgate.toml")
				if err := os.WriteFile(f, []byte(tc.file), 0o600); err != nil {
					t.Fatal(err)
				}
				args = append(args, "--config", f)
			}
			if err := fs.Parse(args); err != nil {
				t.Fatal(err)
			}
			l.mayCreate = true
			store, svc, err := l.openService("", 0, nil)
			if tc.want != outboxFiles && tc.want != outboxSegments {
				if err == nil || !strings.Contains(err.Error(), tc.want) {
					t.Fatalf("openService: %v, want an error containing %q", err, tc.want)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			defer closeAfter(newLoops(), svc, store)
			if got := l.file.Notifications.OutboxFormat; got != tc.want {
				t.Fatalf("format %q, want %q", got, tc.want)
			}
			m := &outbox.Message{Tenant: "t", OperationKey: "k-1", Step: "notification", Channel: "email", To: []string{"a@example.com"}, Body: "hi"}
			if err := store.Update(context.Background(), func(tx ledger.Tx) error { return outbox.Enqueue(tx, m) }); err != nil {
				t.Fatal(err)
			}
			if n, err := svc.Deliverer().DeliverPending(context.Background()); n != 1 || err != nil {
				t.Fatalf("delivered %d, %v; want 1", n, err)
			}
			files, _ := filepath.Glob(filepath.Join(dir, "outbox", "*.json"))
			seg, _ := os.ReadFile(filepath.Join(dir, "outbox", "segments", "000000000001.jsonl"))
			if tc.want == outboxFiles && (len(files) != 1 || len(seg) != 0) ||
				tc.want == outboxSegments && (len(files) != 0 || !strings.HasPrefix(string(seg), `{"message_id":"`+m.MessageID+`"`) || strings.Count(string(seg), "\n") != 1) {
				t.Fatalf("%s: files %v, segment %q; want the message in the format alone", tc.want, files, seg)
			}
		})
	}
}
