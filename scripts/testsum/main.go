// Command testsum reads the output of `go test -json` on its standard
// input, prints one line per package as go test does (and the output of
// every failing test and package), then a summary: packages and tests
// passed, failed and skipped, the slowest packages, and every skipped test
// grouped by the reason it gave. scripts/test pipes each tier through it.
//
//	go test -json ./... | go run ./scripts/testsum -tier short
//
// It exits 1 when a test, a package or its build failed, when the stream
// ended inside a package, or when no test ran for an -expect (a -run
// pattern that no longer matches a renamed test); 0 otherwise. Lines that
// are not JSON are printed as they are.
package main

import (
	"bufio"
	"cmp"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"regexp"
	"slices"
	"strings"
)

// event is one line of `go test -json`: a test event (cmd/test2json) or a
// build event (go help buildjson).
type event struct {
	Action      string
	Package     string
	Test        string
	Elapsed     float64
	Output      string
	FailedBuild string
	ImportPath  string
}

// maxLines bounds the lines kept per test or package: the last ones.
const maxLines = 2000

type pkgState struct {
	name    string
	result  string   // "ok", "FAIL", "notests"; "" while running
	elapsed float64  // of every go test run that tested it
	ran     []string // tests, subtests and examples started
	failed  int      // of them, failed
	output  []string // the package's own lines (not a test's)
}

// expectation asks for a test whose name matches test in package pkg
// (as short prints it: ./outbox).
type expectation struct {
	pkg  string
	test *regexp.Regexp
}

type testState struct {
	output []string
}

type skip struct {
	pkg, test, where string
}

type summary struct {
	w        io.Writer
	expect   []expectation
	pkgs     map[string]*pkgState
	order    []string
	tests    map[[2]string]*testState
	builds   map[string][]string
	passed   int
	failed   []string
	skipped  map[string][]skip // by reason
	topLevel int
	// figures are the lines tests print for the summary (starting
	// "e2e "): the end-to-end chaos tests' counts.
	figures []string
}

func newSummary(w io.Writer, expect []expectation) *summary {
	return &summary{
		w: w, expect: expect,
		pkgs: map[string]*pkgState{}, tests: map[[2]string]*testState{},
		builds: map[string][]string{}, skipped: map[string][]skip{},
	}
}

func keep(lines []string, s string) []string {
	lines = append(lines, s)
	if len(lines) > maxLines {
		lines = slices.Delete(lines, 0, len(lines)-maxLines)
	}
	return lines
}

func (s *summary) pkg(name string) *pkgState {
	p := s.pkgs[name]
	if p == nil {
		p = &pkgState{name: name}
		s.pkgs[name] = p
		s.order = append(s.order, name)
	}
	return p
}

func (s *summary) test(pkg, name string) *testState {
	k := [2]string{pkg, name}
	t := s.tests[k]
	if t == nil {
		t = &testState{}
		s.tests[k] = t
	}
	return t
}

// line handles one line of the stream.
func (s *summary) line(raw string) {
	var e event
	if !strings.HasPrefix(raw, "{") || json.Unmarshal([]byte(raw), &e) != nil || e.Action == "" {
		fmt.Fprintln(s.w, raw)
		return
	}
	switch e.Action {
	case "build-output":
		s.builds[e.ImportPath] = keep(s.builds[e.ImportPath], e.Output)
		return
	case "build-fail":
		return
	}
	if e.Package == "" {
		return
	}
	p := s.pkg(e.Package)
	if e.Test == "" {
		s.pkgEvent(p, e)
		return
	}
	t := s.test(e.Package, e.Test)
	switch e.Action {
	case "run":
		p.ran = append(p.ran, e.Test)
		if !strings.Contains(e.Test, "/") {
			s.topLevel++
		}
	case "output":
		t.output = keep(t.output, e.Output)
		if strings.HasPrefix(e.Output, figurePrefix) {
			s.figures = append(s.figures, short(e.Package)+": "+strings.TrimSpace(e.Output))
		}
	case "pass":
		s.passed++
		delete(s.tests, [2]string{e.Package, e.Test})
	case "skip":
		reason, where := skipReason(t.output)
		s.skipped[reason] = append(s.skipped[reason], skip{e.Package, e.Test, where})
		delete(s.tests, [2]string{e.Package, e.Test})
	case "fail":
		p.failed++
		s.failed = append(s.failed, short(e.Package)+" "+e.Test)
		fmt.Fprintf(s.w, "--- FAIL: %s %s (%.2fs)\n", short(e.Package), e.Test, e.Elapsed)
		for _, l := range t.output {
			if !strings.HasPrefix(l, "=== ") && !strings.HasPrefix(strings.TrimSpace(l), "--- FAIL") {
				fmt.Fprint(s.w, l)
			}
		}
		delete(s.tests, [2]string{e.Package, e.Test})
	}
}

// pkgEvent handles an event of a package's own (no test).
func (s *summary) pkgEvent(p *pkgState, e event) {
	switch e.Action {
	case "output":
		p.output = keep(p.output, e.Output)
	case "skip":
		if p.result == "" {
			p.result = "notests"
		}
		fmt.Fprintf(s.w, "?    %s [no test files]\n", short(p.name))
	case "pass":
		// A package tested by several go test runs fails if one did.
		if p.result != "FAIL" {
			p.result = "ok"
		}
		p.elapsed += e.Elapsed
		note := ""
		if len(p.ran) == 0 {
			note = " [no tests to run]"
		}
		fmt.Fprintf(s.w, "ok   %s %.1fs%s\n", short(p.name), e.Elapsed, note)
	case "fail":
		p.result = "FAIL"
		p.elapsed += e.Elapsed
		fmt.Fprintf(s.w, "FAIL %s %.1fs\n", short(p.name), e.Elapsed)
		if e.FailedBuild != "" {
			fmt.Fprint(s.w, strings.Join(s.builds[e.FailedBuild], ""))
		} else if p.failed == 0 {
			// No test failed: a panic, a timeout, TestMain, or a
			// failure at exit (a goroutine leak check). Its own lines say.
			fmt.Fprint(s.w, strings.Join(p.output, ""))
		}
	}
}

var location = regexp.MustCompile(`^\s*(\S+\.go:\d+): (.*)$`)

// skipReason returns the message a skipped test gave (its last log
// entry: t.Skip's) and where it was logged.
func skipReason(output []string) (reason, where string) {
	var lines []string
	for _, l := range output {
		l = strings.TrimRight(l, "\n")
		t := strings.TrimSpace(l)
		if t == "" || strings.HasPrefix(l, "=== ") || strings.HasPrefix(t, "--- SKIP") {
			continue
		}
		if m := location.FindStringSubmatch(l); m != nil {
			lines, where = []string{m[2]}, m[1]
			continue
		}
		lines = append(lines, t)
	}
	if len(lines) == 0 {
		return "(no message)", ""
	}
	return strings.Join(lines, " "), where
}

// short drops the repository's module path from a package path.
func short(pkg string) string {
	if rest, ok := strings.CutPrefix(pkg, "github.com/oncommit/oncommit"); ok {
		return "." + rest
	}
	return pkg
}

// figurePrefix starts a line a test prints for the summary.
const figurePrefix = "e2e "

// report prints the summary and returns whether the run is good.
func (s *summary) report(tier string) bool {
	w := s.w
	var ok, failed, notests, unfinished []*pkgState
	for _, name := range s.order {
		p := s.pkgs[name]
		switch {
		case p.result == "ok":
			ok = append(ok, p)
		case p.result == "FAIL":
			failed = append(failed, p)
		case p.result == "notests":
			notests = append(notests, p)
		default:
			unfinished = append(unfinished, p)
		}
	}
	nskipped := 0
	for _, l := range s.skipped {
		nskipped += len(l)
	}
	fmt.Fprintf(w, "\n== summary of the %s tier ==\n", tier)
	fmt.Fprintf(w, "packages: %d ok, %d failed, %d without test files", len(ok), len(failed), len(notests))
	if len(unfinished) > 0 {
		fmt.Fprintf(w, ", %d did not finish", len(unfinished))
	}
	fmt.Fprintln(w)
	fmt.Fprintf(w, "tests:    %d passed, %d failed, %d skipped (%d top-level tests; subtests and examples counted)\n",
		s.passed, len(s.failed), nskipped, s.topLevel)

	slowest := slices.Clone(ok)
	slowest = append(slowest, failed...)
	slices.SortFunc(slowest, func(a, b *pkgState) int { return cmp.Compare(b.elapsed, a.elapsed) })
	if len(slowest) > 0 {
		fmt.Fprintln(w, "slowest packages:")
		for _, p := range slowest[:min(8, len(slowest))] {
			fmt.Fprintf(w, "  %7.1fs  %s\n", p.elapsed, short(p.name))
		}
	}

	if len(s.figures) > 0 {
		fmt.Fprintln(w, "figures:")
		for _, f := range s.figures {
			fmt.Fprintf(w, "  %s\n", f)
		}
	}

	if nskipped > 0 {
		fmt.Fprintf(w, "skipped tests, by reason:\n")
		reasons := make([]string, 0, len(s.skipped))
		for r := range s.skipped {
			reasons = append(reasons, r)
		}
		slices.SortFunc(reasons, func(a, b string) int {
			return cmp.Or(cmp.Compare(len(s.skipped[b]), len(s.skipped[a])), strings.Compare(a, b))
		})
		for _, r := range reasons {
			l := s.skipped[r]
			fmt.Fprintf(w, "  %4d  %s\n", len(l), r)
			for i, sk := range l {
				if i == 3 {
					fmt.Fprintf(w, "          and %d more\n", len(l)-i)
					break
				}
				fmt.Fprintf(w, "          %s %s (%s)\n", short(sk.pkg), sk.test, sk.where)
			}
		}
	}
	good := len(failed) == 0 && len(s.failed) == 0 && len(unfinished) == 0
	for _, p := range unfinished {
		fmt.Fprintf(w, "did not finish: %s\n", short(p.name))
		fmt.Fprint(w, strings.Join(p.output, ""))
	}
	if len(s.failed) > 0 {
		fmt.Fprintln(w, "failed tests:")
		for _, f := range s.failed {
			fmt.Fprintf(w, "  %s\n", f)
		}
	}
	for _, p := range failed {
		if p.failed == 0 {
			fmt.Fprintf(w, "failed package: %s (no failing test; see its output above)\n", short(p.name))
		}
	}
	for _, x := range s.expect {
		found := false
		if p := s.pkgs["github.com/oncommit/oncommit"+strings.TrimPrefix(x.pkg, ".")]; p != nil {
			found = slices.ContainsFunc(p.ran, x.test.MatchString)
		}
		if !found {
			fmt.Fprintf(w, "ran no test matching %s in %s (renamed? the tier's -run pattern misses it)\n", x.test, x.pkg)
			good = false
		}
	}
	if good {
		fmt.Fprintf(w, "%s tier: PASS\n", tier)
	} else {
		fmt.Fprintf(w, "%s tier: FAIL\n", tier)
	}
	return good
}

func main() {
	tier := flag.String("tier", "test", "the tier's name, for the summary")
	var expect []expectation
	flag.Func("expect", "`pkg=regexp`: fail unless a test matching regexp ran in pkg (./outbox); repeatable", func(v string) error {
		pkg, re, ok := strings.Cut(v, "=")
		if !ok {
			return fmt.Errorf("want pkg=regexp, got %q", v)
		}
		r, err := regexp.Compile(re)
		if err != nil {
			return err
		}
		expect = append(expect, expectation{pkg, r})
		return nil
	})
	flag.Parse()
	s := newSummary(os.Stdout, expect)
	r := bufio.NewReaderSize(os.Stdin, 1<<20)
	for {
		l, err := r.ReadString('\n')
		if l = strings.TrimRight(l, "\n"); l != "" {
			s.line(l)
		}
		if err != nil {
			if err != io.EOF {
				fmt.Fprintln(os.Stderr, "testsum:", err)
				os.Exit(2)
			}
			break
		}
	}
	if !s.report(*tier) {
		os.Exit(1)
	}
}
