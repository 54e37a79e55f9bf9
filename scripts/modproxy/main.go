// Command modproxy writes a file-based Go module proxy (GOPROXY=file://DIR)
// holding this repository's published modules at one version, as if they
// had been tagged: the library, dialect/sqlite, dialect/mysql and otel. Each
// module's go.mod is written as a release would have it: requirements of
// the other oncommit modules at that version, and no replace directives.
// scripts/modgraph.sh uses it to measure what a service pays for importing
// oncommit, against the layout a tag would publish.
//
//	go run ./scripts/modproxy -repo . -version v0.1.0 -out /tmp/proxy
package main

import (
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/mod/modfile"
	"golang.org/x/mod/module"
	"golang.org/x/mod/zip"
)

const root = "github.com/oncommit/oncommit"

// published are the module directories a release tags.
var published = []string{".", "dialect/sqlite", "dialect/mysql", "otel"}

func main() {
	repo := flag.String("repo", ".", "repository root")
	version := flag.String("version", "v0.1.0", "version to publish as")
	out := flag.String("out", "", "proxy directory to write")
	flag.Parse()
	if *out == "" {
		fmt.Fprintln(os.Stderr, "modproxy: -out is required")
		os.Exit(2)
	}
	for _, dir := range published {
		if err := publish(*repo, dir, *version, *out); err != nil {
			fmt.Fprintf(os.Stderr, "modproxy: %s: %v\n", dir, err)
			os.Exit(1)
		}
	}
}

func publish(repo, dir, version, out string) error {
	src := filepath.Join(repo, dir)
	data, err := os.ReadFile(filepath.Join(src, "go.mod"))
	if err != nil {
		return err
	}
	mf, err := modfile.Parse("go.mod", data, nil)
	if err != nil {
		return err
	}
	path := mf.Module.Mod.Path
	for _, r := range mf.Require {
		if r.Mod.Path == root || strings.HasPrefix(r.Mod.Path, root+"/") {
			if err := mf.AddRequire(r.Mod.Path, version); err != nil {
				return err
			}
		}
	}
	for _, r := range append([]*modfile.Replace(nil), mf.Replace...) {
		if err := mf.DropReplace(r.Old.Path, r.Old.Version); err != nil {
			return err
		}
	}
	mf.Cleanup()
	gomod, err := mf.Format()
	if err != nil {
		return err
	}
	// The module's files as git tracks them, without nested modules.
	tmp, err := os.MkdirTemp("", "modproxy")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	ls, err := exec.Command("git", "-C", src, "ls-files", "-z", ".").Output()
	if err != nil {
		return fmt.Errorf("git ls-files: %w", err)
	}
	for _, f := range strings.Split(strings.TrimRight(string(ls), "\x00"), "\x00") {
		if f == "" || inNested(src, f) {
			continue
		}
		b, err := os.ReadFile(filepath.Join(src, f))
		if err != nil {
			return err
		}
		if err := os.MkdirAll(filepath.Join(tmp, filepath.Dir(f)), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(tmp, f), b, 0o644); err != nil {
			return err
		}
	}
	if err := os.WriteFile(filepath.Join(tmp, "go.mod"), gomod, 0o644); err != nil {
		return err
	}
	epath, err := module.EscapePath(path)
	if err != nil {
		return err
	}
	vdir := filepath.Join(out, epath, "@v")
	if err := os.MkdirAll(vdir, 0o755); err != nil {
		return err
	}
	z, err := os.Create(filepath.Join(vdir, version+".zip"))
	if err != nil {
		return err
	}
	if err := zip.CreateFromDir(z, module.Version{Path: path, Version: version}, tmp); err != nil {
		z.Close()
		return err
	}
	if err := z.Close(); err != nil {
		return err
	}
	info := fmt.Sprintf(`{"Version":%q,"Time":%q}`, version, time.Now().UTC().Format(time.RFC3339))
	for name, body := range map[string][]byte{version + ".mod": gomod, version + ".info": []byte(info), "list": []byte(version + "\n")} {
		if err := os.WriteFile(filepath.Join(vdir, name), body, 0o644); err != nil {
			return err
		}
	}
	fmt.Printf("%s@%s\n", path, version)
	return nil
}

// inNested reports whether file f (relative to the module directory src)
// lies in a directory below src that has a go.mod of its own.
func inNested(src, f string) bool {
	for d := filepath.Dir(f); d != "." && d != "/"; d = filepath.Dir(d) {
		if _, err := os.Stat(filepath.Join(src, d, "go.mod")); err == nil {
			return true
		}
	}
	return false
}
