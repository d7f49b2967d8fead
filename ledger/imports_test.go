package ledger

import (
	"go/parser"
	"go/token"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// TestImportsNothingOfOurs: the rules do not depend on a backend (or on
// anything else of this module); backends import ledger, never the
// reverse.
func TestImportsNothingOfOurs(t *testing.T) {
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		af, err := parser.ParseFile(token.NewFileSet(), f, nil, parser.ImportsOnly)
		if err != nil {
			t.Fatal(err)
		}
		for _, imp := range af.Imports {
			path, _ := strconv.Unquote(imp.Path.Value)
			if path == "idemgate" || strings.HasPrefix(path, "idemgate/") || strings.Contains(path, "bbolt") {
				t.Errorf("%s imports %s", f, path)
			}
		}
	}
}
