package dialecttest

import "testing"

func TestJSONEqual(t *testing.T) {
	for _, tc := range []struct {
		a, b  string
		equal bool
	}{
		{`1e2`, `100`, true}, {`1.0`, `1`, true}, {`-0`, `0`, true}, {`0.000e-16383`, `0`, true},
		{`1E+2`, `100.000`, true}, {`0.00000001e131079`, `1e131071`, true},
		{`{"a":1,"a":2}`, `{"a": 2}`, true}, {`{"b":[1,{"c":null}],"a":"x"}`, `{"a":"x","b":[1,{"c":null}]}`, true},
		{`"\ud83d\ude00"`, `"😀"`, true}, {`0e99999999999999999999`, `0`, true},
		{`1`, `2`, false}, {`-1`, `1`, false}, {`1e2`, `10`, false}, {`1e99999999999999999999`, `1e99999999999999999998`, false},
		{`{"a":1}`, `{"a":1,"b":2}`, false}, {`{"a":1}`, `{"b":1}`, false}, {`"a"`, `"b"`, false},
		{`[1]`, `[1,1]`, false}, {`null`, `false`, false}, {`"1"`, `1`, false}, {`{}`, `[]`, false},
	} {
		if err := JSONEqual([]byte(tc.a), []byte(tc.b)); (err == nil) != tc.equal {
			t.Errorf("JSONEqual(%s, %s) = %v, want equal: %v", tc.a, tc.b, err, tc.equal)
		}
	}
}

func TestParseCorpusFile(t *testing.T) {
	p, err := parseCorpusFile([]byte("go test fuzz v1\n[]byte(\"\\\"\\\\ud800\\\"\\x00\")\n"))
	if err != nil || string(p) != "\"\\ud800\"\x00" {
		t.Errorf("parseCorpusFile = %q, %v", p, err)
	}
	if _, err := parseCorpusFile([]byte("go test fuzz v1\nstring(\"x\")\n")); err == nil {
		t.Error("a string value parsed as []byte")
	}
}
