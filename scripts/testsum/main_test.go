package main

import (
	"bytes"
	"regexp"
	"strings"
	"testing"
)

// stream is a `go test -json` stream (cut down): package a passes with a
// skipped subtest, b fails a test, c fails its build, d has no test files,
// e runs no test (a -run pattern matching nothing).
const stream = `{"Action":"start","Package":"github.com/oncommit/oncommit/a"}
{"Action":"run","Package":"github.com/oncommit/oncommit/a","Test":"TestA"}
{"Action":"run","Package":"github.com/oncommit/oncommit/a","Test":"TestA/mysql"}
{"Action":"output","Package":"github.com/oncommit/oncommit/a","Test":"TestA/mysql","Output":"=== RUN   TestA/mysql\n"}
{"Action":"output","Package":"github.com/oncommit/oncommit/a","Test":"TestA/mysql","Output":"    a_test.go:10: connecting\n"}
{"Action":"output","Package":"github.com/oncommit/oncommit/a","Test":"TestA/mysql","Output":"    mysqltest.go:42: no MySQL at root@tcp(127.0.0.1:3306)/test:\n"}
{"Action":"output","Package":"github.com/oncommit/oncommit/a","Test":"TestA/mysql","Output":"        connection refused\n"}
{"Action":"output","Package":"github.com/oncommit/oncommit/a","Test":"TestA/mysql","Output":"--- SKIP: TestA/mysql (0.00s)\n"}
{"Action":"skip","Package":"github.com/oncommit/oncommit/a","Test":"TestA/mysql","Elapsed":0}
{"Action":"pass","Package":"github.com/oncommit/oncommit/a","Test":"TestA","Elapsed":0.1}
{"Action":"pass","Package":"github.com/oncommit/oncommit/a","Elapsed":1.5}
{"Action":"run","Package":"github.com/oncommit/oncommit/b","Test":"TestB"}
{"Action":"output","Package":"github.com/oncommit/oncommit/b","Test":"TestB","Output":"    b_test.go:7: got 2, want 3\n"}
{"Action":"fail","Package":"github.com/oncommit/oncommit/b","Test":"TestB","Elapsed":0.2}
{"Action":"fail","Package":"github.com/oncommit/oncommit/b","Elapsed":3.25}
{"ImportPath":"github.com/oncommit/oncommit/c","Action":"build-output","Output":"c/c.go:3:1: syntax error\n"}
{"ImportPath":"github.com/oncommit/oncommit/c","Action":"build-fail"}
{"Action":"fail","Package":"github.com/oncommit/oncommit/c","Elapsed":0,"FailedBuild":"github.com/oncommit/oncommit/c"}
{"Action":"skip","Package":"github.com/oncommit/oncommit/d"}
{"Action":"output","Package":"github.com/oncommit/oncommit/e","Output":"testing: warning: no tests to run\n"}
{"Action":"pass","Package":"github.com/oncommit/oncommit/e","Elapsed":0.01}
not json: go: warning
`

func run(t *testing.T, in string, expect ...expectation) (string, bool) {
	t.Helper()
	var out bytes.Buffer
	s := newSummary(&out, expect)
	for l := range strings.Lines(in) {
		s.line(strings.TrimRight(l, "\n"))
	}
	good := s.report("short")
	return out.String(), good
}

func TestSummary(t *testing.T) {
	out, good := run(t, stream)
	t.Log(out)
	if good {
		t.Error("a run with a failed test and a failed build reported good")
	}
	for _, want := range []string{
		"ok   ./a 1.5s\n",
		"--- FAIL: ./b TestB (0.20s)\n    b_test.go:7: got 2, want 3\n",
		"FAIL ./b 3.2s\n",
		"FAIL ./c 0.0s\nc/c.go:3:1: syntax error\n",
		"?    ./d [no test files]\n",
		"ok   ./e 0.0s [no tests to run]\n",
		"not json: go: warning\n",
		"packages: 2 ok, 2 failed, 1 without test files\n",
		"tests:    1 passed, 1 failed, 1 skipped (2 top-level tests;",
		"     1  no MySQL at root@tcp(127.0.0.1:3306)/test: connection refused\n          ./a TestA/mysql (mysqltest.go:42)\n",
		"failed tests:\n  ./b TestB\n",
		"short tier: FAIL\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q", want)
		}
	}
}

func TestSummaryGood(t *testing.T) {
	passing := strings.Join(slicesOf(stream, "/a\"", "/d\""), "")
	out, good := run(t, passing)
	if !good || !strings.Contains(out, "short tier: PASS\n") {
		t.Errorf("a passing run: good %v\n%s", good, out)
	}
	if _, good := run(t, passing+`{"Action":"run","Package":"github.com/oncommit/oncommit/f","Test":"TestF"}`); good {
		t.Error("a stream that ended inside a package reported good")
	}
}

// TestSummaryTwoRuns: a package tested by two go test runs in one stream
// fails when either run failed, and its time is the sum.
func TestSummaryTwoRuns(t *testing.T) {
	fail := `{"Action":"run","Package":"github.com/oncommit/oncommit/b","Test":"TestB"}
{"Action":"fail","Package":"github.com/oncommit/oncommit/b","Test":"TestB","Elapsed":0.2}
{"Action":"fail","Package":"github.com/oncommit/oncommit/b","Elapsed":3}
`
	pass := `{"Action":"run","Package":"github.com/oncommit/oncommit/b","Test":"TestChaos"}
{"Action":"pass","Package":"github.com/oncommit/oncommit/b","Test":"TestChaos","Elapsed":1}
{"Action":"pass","Package":"github.com/oncommit/oncommit/b","Elapsed":2}
`
	for _, in := range []string{fail + pass, pass + fail} {
		out, good := run(t, in)
		if good || !strings.Contains(out, "packages: 0 ok, 1 failed") || !strings.Contains(out, "5.0s  ./b") {
			t.Errorf("a package failed in one of two runs: good %v\n%s", good, out)
		}
	}
}

func TestSummaryExpect(t *testing.T) {
	passing := strings.Join(slicesOf(stream, "/a\"", "/e\""), "")
	if out, good := run(t, passing, expectation{"./a", regexp.MustCompile(`/mysql$`)}); !good {
		t.Errorf("-expect ./a=/mysql$ with TestA/mysql run (and skipped): not good\n%s", out)
	}
	for _, x := range []expectation{
		{"./e", regexp.MustCompile(`.`)},        // ran no test
		{"./a", regexp.MustCompile(`^TestB$`)},  // another package's test
		{"./nosuch", regexp.MustCompile(`.`)},   // not in the stream
		{"./a", regexp.MustCompile(`/sqlite$`)}, // no such subtest
	} {
		if out, good := run(t, passing, x); good || !strings.Contains(out, "ran no test matching "+x.test.String()+" in "+x.pkg) {
			t.Errorf("-expect %s=%s: good %v\n%s", x.pkg, x.test, good, out)
		}
	}
}

// slicesOf returns the lines of s that contain one of subs.
func slicesOf(s string, subs ...string) []string {
	var out []string
	for l := range strings.Lines(s) {
		for _, sub := range subs {
			if strings.Contains(l, sub) {
				out = append(out, l)
				break
			}
		}
	}
	return out
}

// TestSummaryFigures: a line a test prints starting "e2e " is shown in the
// summary, with its package.
func TestSummaryFigures(t *testing.T) {
	in := `{"Action":"run","Package":"github.com/oncommit/oncommit/forward/nats","Test":"TestE2E"}
{"Action":"output","Package":"github.com/oncommit/oncommit/forward/nats","Test":"TestE2E","Output":"e2e TestHelperE2E: 5000 published, 0 lost\n"}
{"Action":"pass","Package":"github.com/oncommit/oncommit/forward/nats","Test":"TestE2E","Elapsed":14}
{"Action":"pass","Package":"github.com/oncommit/oncommit/forward/nats","Elapsed":15}
`
	out, good := run(t, in)
	if !good || !strings.Contains(out, "figures:\n  ./forward/nats: e2e TestHelperE2E: 5000 published, 0 lost\n") {
		t.Fatalf("good %v, summary:\n%s", good, out)
	}
}
