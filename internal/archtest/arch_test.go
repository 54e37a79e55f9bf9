// Package archtest holds the test that pins the package arrows of
// docs/internals.md.
package archtest

import (
	"os/exec"
	"strings"
	"testing"
)

const mod = "github.com/oncommit/oncommit"

// deps returns the packages pkg imports, directly or not (go list -deps,
// which sees the workspace's nested modules through go.work).
func deps(t *testing.T, pkg string) []string {
	t.Helper()
	out, err := exec.Command("go", "list", "-deps", "-f", "{{.ImportPath}}", pkg).Output()
	if err != nil {
		if ee, ok := err.(*exec.ExitError); ok {
			t.Fatalf("go list %s: %v\n%s", pkg, err, ee.Stderr)
		}
		t.Fatalf("go list %s: %v", pkg, err)
	}
	return strings.Fields(string(out))
}

// TestArrows: outbox imports no adapter, no dialect and no driver;
// outboxdriver imports no other package of oncommit; dialects import
// outboxdriver and neither outbox nor an adapter; adapters import no
// dialect and not outbox.
func TestArrows(t *testing.T) {
	dialects := []string{mod + "/dialect/postgres", mod + "/dialect/sqlite", mod + "/dialect/mysql"}
	adapters := []string{mod + "/adapters/sqltx", mod + "/adapters/pgxtx"}
	never := map[string][]string{
		mod + "/outbox":         append(append([]string{"github.com/jackc/", "github.com/lib/pq", "modernc.org/", "github.com/go-sql-driver/"}, dialects...), adapters...),
		mod + "/outboxdriver":   {mod + "/outbox", mod + "/adapters/", mod + "/dialect/", mod + "/internal/"},
		mod + "/adapters/sqltx": append([]string{mod + "/outbox", "github.com/jackc/", "modernc.org/", "github.com/go-sql-driver/", "github.com/lib/pq"}, dialects...),
		mod + "/adapters/pgxtx": append([]string{mod + "/outbox"}, dialects...),
	}
	for _, d := range dialects {
		never[d] = append([]string{mod + "/outbox", mod + "/adapters/"}, dialects...)
	}
	for pkg, forbidden := range never {
		for _, dep := range deps(t, pkg) {
			if dep == pkg {
				continue
			}
			for _, f := range forbidden {
				if dep == f || (strings.HasSuffix(f, "/") && strings.HasPrefix(dep, f)) {
					t.Errorf("%s imports %s", pkg, dep)
				}
			}
		}
	}
	for _, d := range dialects {
		found := false
		for _, dep := range deps(t, d) {
			found = found || dep == mod+"/outboxdriver"
		}
		if !found {
			t.Errorf("%s does not import outboxdriver", d)
		}
	}
}
