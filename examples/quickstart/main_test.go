package main

import (
	"bytes"
	"context"
	"go/ast"
	"go/build"
	"go/parser"
	"go/token"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestQuickStart runs the quick start and checks the story it tells: the
// rolled-back order left nothing, the retried request was a duplicate,
// every delivered message is gone and the dead letter stayed, and every
// name of the library it prints (outbox.X, sqlite.X) is one the packages
// export.
func TestQuickStart(t *testing.T) {
	var out bytes.Buffer
	if err := run(context.Background(), &out); err != nil {
		t.Fatalf("run: %v\n%s", err, out.String())
	}
	text := out.String()
	t.Log(text)
	for _, want := range []string{
		"rows left for A-1003: 0 order, 0 message",
		"Publish reports duplicate=true",
		"(errors.As *outbox.MessageError: true)",
		"order.placed   A-1002 attempt 2: confirmation sent",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("output lacks %q", want)
		}
	}
	// The table after the relay: the dead letter alone.
	_, after, ok := strings.Cut(text, "\n7. ")
	if !ok {
		t.Fatal("output lacks step 7")
	}
	rows := regexp.MustCompile(`(?m)^   \S+\s+(\S+)\s+(\S+)\s+(\S+)\s+(\d+)`).FindAllStringSubmatch(after, -1)
	if len(rows) != 1 || rows[0][1] != "invoice.issued" || rows[0][3] != "dead" {
		t.Errorf("table after the relay: %q, want the invoice.issued message alone, dead", rows)
	}

	exported := map[string]map[string]bool{
		"outbox": exports(t, "github.com/oncommit/oncommit/outbox"),
		"sqlite": exports(t, "github.com/oncommit/oncommit/dialect/sqlite"),
	}
	for _, m := range regexp.MustCompile(`\b(outbox|sqlite)\.([A-Z]\w*)`).FindAllStringSubmatch(text, -1) {
		if !exported[m[1]][m[2]] { // the regexp took exported names only
			t.Errorf("the output names %s, which package %s does not export", m[0], m[1])
		}
	}
}

// exports returns the package-level names of the package at
// import path, read from its source.
func exports(t *testing.T, path string) map[string]bool {
	t.Helper()
	bp, err := build.Import(path, ".", 0)
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{}
	for _, name := range bp.GoFiles {
		f, err := parser.ParseFile(token.NewFileSet(), filepath.Join(bp.Dir, name), nil, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range f.Decls {
			switch d := d.(type) {
			case *ast.FuncDecl:
				if d.Recv == nil {
					names[d.Name.Name] = true
				}
			case *ast.GenDecl:
				for _, s := range d.Specs {
					switch s := s.(type) {
					case *ast.TypeSpec:
						names[s.Name.Name] = true
					case *ast.ValueSpec:
						for _, n := range s.Names {
							names[n.Name] = true
						}
					}
				}
			}
		}
	}
	if len(names) == 0 {
		t.Fatalf("no names in %s (%s)", path, bp.Dir)
	}
	return names
}
