package main

import (
	"crypto/ed25519"
	"crypto/x509"
	"encoding/pem"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestCheckpointKeyRefused: a checkpoint key file that cannot do its job
// — missing, not PEM, another kind of key, a private key others may read,
// a public key asked to sign — and a --checkpoint without a key or
// without a checkpoint are refused with a message saying what to do, and
// nothing is exported or proved.
func TestCheckpointKeyRefused(t *testing.T) {
	dir := t.TempDir()
	db := filepath.Join(dir, "ledger.db")
	writeAuditHistory(t, db)
	pub, priv, err := ed25519.GenerateKey(nil)
	if err != nil {
		t.Fatal(err)
	}
	p8, _ := x509.MarshalPKCS8PrivateKey(priv)
	pkix, _ := x509.MarshalPKIXPublicKey(pub)
	write := func(name string, b []byte, mode os.FileMode) string {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, b, mode); err != nil {
			t.Fatal(err)
		}
		return path
	}
	private := write("key.pem", pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: p8}), 0o600)
	public := write("key.pub.pem", pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pkix}), 0o644)
	readable := write("readable.pem", pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: p8}), 0o644)
	notPEM := write("key.txt", []byte("not a key\n"), 0o600)
	rsaLike := write("cert.pem", pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: []byte{1, 2, 3}}), 0o600)
	noCheckpoint := write("empty.log", []byte("level=INFO msg=\"serving MCP on stdio\"\n"), 0o600)

	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"export", "--audit-checkpoint-key", filepath.Join(dir, "missing.pem")}, "no such file"},
		{[]string{"export", "--audit-checkpoint-key", notPEM}, "openssl genpkey -algorithm ed25519"},
		{[]string{"export", "--audit-checkpoint-key", rsaLike}, `a PEM "CERTIFICATE" block`},
		{[]string{"export", "--audit-checkpoint-key", readable}, "chmod 600"},
		{[]string{"verify", "--checkpoint", noCheckpoint}, "--checkpoint needs the key"},
	} {
		code, out, stderr := runCmd(append([]string{"audit", tc.args[0], "--db", db}, tc.args[1:]...)...)
		if code != 2 || !strings.Contains(stderr, tc.want) || out != "" {
			t.Errorf("audit %v = exit %d, stdout %d bytes, %q; want exit 2, nothing on stdout, and %q", tc.args, code, len(out), stderr, tc.want)
		}
	}
	if code, _, stderr := runCmd("audit", "verify", "--db", db, "--checkpoint", noCheckpoint, "--audit-checkpoint-key", public); code != 1 || !strings.Contains(stderr, "no audit checkpoint in it") {
		t.Errorf("verify --checkpoint of a file without one = exit %d, %q", code, stderr)
	}
	code, out, stderr := runCmd("audit", "export", "--db", db, "--audit-checkpoint-key", public)
	if code != 0 || strings.Contains(out, "audit_checkpoint") || !strings.Contains(stderr, "is a public key, which cannot sign") {
		t.Errorf("export with a public key = exit %d, %q; want the entries, no checkpoint, and a note", code, stderr)
	}
	code, out, _ = runCmd("audit", "export", "--db", db, "--audit-checkpoint-key", private)
	export := write("export.jsonl", []byte(out), 0o600)
	if code != 0 || !strings.Contains(out, `{"audit_checkpoint":`) {
		t.Fatalf("export with the private key = exit %d", code)
	}
	if code, out, stderr := runCmd("audit", "verify", "--db", db, "--checkpoint", export, "--archive", export, "--audit-checkpoint-key", public); code != 0 || !strings.Contains(out, "checkpoints: 1 from") {
		t.Errorf("verify --checkpoint --archive of the export = exit %d, %q %q", code, out, stderr)
	}
}
