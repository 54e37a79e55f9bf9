package outbox

import (
	"bytes"
	"errors"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/oncommit/oncommit/outboxdriver"
)

type stubDialect struct{ caps outboxdriver.Capabilities }

func (stubDialect) Name() string                              { return "stub" }
func (s stubDialect) Capabilities() outboxdriver.Capabilities { return s.caps }
func (stubDialect) Insert(Table, []outboxdriver.Row, outboxdriver.Wake) (string, []any) {
	return "", nil
}
func (stubDialect) Classify(err error) error { return err }

func TestConfigValidation(t *testing.T) {
	pg := stubDialect{outboxdriver.Capabilities{Notify: true, MaxParams: 65535, ParamsPerRow: 7}}
	quiet := stubDialect{outboxdriver.Capabilities{MaxParams: 999, ParamsPerRow: 7}}
	for _, tc := range []struct {
		name  string
		d     Dialect
		cfg   Config
		field string // "" means valid; "-" means ErrUnsupported
	}{
		{"zero value", pg, Config{}, ""},
		{"qualified", pg, Config{Table: "app_1.outbox_2"}, ""},
		{"nil dialect", nil, Config{}, "Dialect"},
		{"upper case", pg, Config{Table: "Outbox"}, "Table"},
		{"injection", pg, Config{Table: `outbox"; DROP TABLE x; --`}, "Table"},
		{"three parts", pg, Config{Table: "a.b.c"}, "Table"},
		{"empty schema", pg, Config{Table: ".outbox"}, "Table"},
		{"digit first", pg, Config{Table: "1outbox"}, "Table"},
		{"64 bytes", pg, Config{Table: strings.Repeat("a", 64)}, "Table"},
		{"channel too long", pg, Config{Table: strings.Repeat("a", 40) + "." + strings.Repeat("b", 40)}, "Table"},
		{"channel too long, notify off", pg, Config{Table: strings.Repeat("a", 40) + "." + strings.Repeat("b", 40), Notify: NotifyOff}, ""},
		{"negative payload", pg, Config{MaxPayloadBytes: -1}, "MaxPayloadBytes"},
		{"negative batch", pg, Config{MaxBatch: -1}, "MaxBatch"},
		{"batch over params", pg, Config{MaxBatch: 10000}, "MaxBatch"},
		{"default batch over small params", quiet, Config{}, "MaxBatch"},
		{"negative timeout", pg, Config{CommandTimeout: -1}, "CommandTimeout"},
		{"negative notify interval", pg, Config{NotifyInterval: -5 * time.Millisecond}, "NotifyInterval"},
		{"notify every publish", pg, Config{NotifyInterval: NotifyEvery}, ""},
		{"unknown notify", pg, Config{Notify: 7}, "Notify"},
		{"notify unsupported", quiet, Config{Notify: NotifyOn, MaxBatch: 10}, "-"},
		{"notify auto without support", quiet, Config{MaxBatch: 10}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := New(tc.d, tc.cfg)
			var ce *ConfigError
			switch tc.field {
			case "":
				if err != nil {
					t.Fatal(err)
				}
			case "-":
				if !errors.Is(err, ErrUnsupported) {
					t.Fatalf("error %v, want ErrUnsupported", err)
				}
			default:
				if !errors.Is(err, ErrInvalidConfig) || !errors.As(err, &ce) || ce.Field != tc.field {
					t.Fatalf("error %v, want a ConfigError on %s", err, tc.field)
				}
			}
		})
	}
}

func TestIDs(t *testing.T) {
	ids := make([]ID, 10000)
	for i := range ids {
		ids[i] = NewID()
	}
	if !sort.SliceIsSorted(ids, func(i, j int) bool { return bytes.Compare(ids[i][:], ids[j][:]) < 0 }) {
		t.Error("ids are not monotonic")
	}
	seen := map[ID]bool{}
	for _, id := range ids {
		if seen[id] {
			t.Fatal("duplicate id")
		}
		seen[id] = true
		s := id.String()
		if len(s) != 36 || strings.ToLower(s) != s {
			t.Fatalf("text form %q", s)
		}
		p, err := ParseID(s)
		if err != nil || p != id {
			t.Fatalf("ParseID(%q) = %v, %v", s, p, err)
		}
		if p, err := ParseID(strings.ToUpper(s)); err != nil || p != id {
			t.Fatalf("upper case %q: %v", s, err)
		}
	}
	fixed := ID{0x00, 0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08, 0x09, 0x0a, 0x0b, 0x0c, 0x0d, 0xfe, 0xff}
	if s := fixed.String(); s != "00010203-0405-0607-0809-0a0b0c0dfeff" {
		t.Errorf("String() = %s", s)
	}
	if p, err := ParseID("00010203-0405-0607-0809-0A0B0C0DFEFF"); err != nil || p != fixed {
		t.Errorf("ParseID = %v, %v", p, err)
	}
	for _, bad := range []string{"", "0", "00010203-0405-0607-0809-0a0b0c0dfefg", "00010203x0405-0607-0809-0a0b0c0dfeff", "01ARZ3NDEKTSV4RRFFQ69G5FAV", "zzzzzzzz-zzzz-zzzz-zzzz-zzzzzzzzzzzz", "0123456789abcdef0123456789abcdef0123"} {
		if _, err := ParseID(bad); err == nil {
			t.Errorf("ParseID(%q) succeeded", bad)
		}
	}
	var id ID
	if err := id.UnmarshalText([]byte(ids[0].String())); err != nil || id != ids[0] {
		t.Error("UnmarshalText")
	}
	if got, _ := ids[0].MarshalText(); string(got) != ids[0].String() {
		t.Error("MarshalText")
	}
}

func TestCheckJSON(t *testing.T) {
	deep := func(n int) string { return strings.Repeat("[", n) + strings.Repeat("]", n) }
	for _, tc := range []struct {
		in    string
		depth int // 0: MaxPayloadDepth
		ok    bool
	}{
		{in: `null`, ok: true}, {in: `{}`, ok: true}, {in: `"a\\u0000"`, ok: true}, {in: `"\\"`, ok: true}, {in: `"\"{["`, ok: true},
		{in: deep(MaxPayloadDepth), ok: true}, {in: `{"a":[1,{"b":"\u00e9"}]}`, ok: true},
		{in: `"\u0000"`, ok: false}, {in: `"x\\\u0000"`, ok: false}, {in: deep(MaxPayloadDepth + 1), ok: false},
		{in: `{`, ok: false}, {in: `NaN`, ok: false}, {in: `Infinity`, ok: false}, {in: "\"\xc3\x28\"", ok: false}, {in: ``, ok: false},
		// MariaDB's JSON_VALID: 31 levels, not 32.
		{in: deep(31), depth: 31, ok: true}, {in: deep(32), depth: 31, ok: false},
		{in: `[{"a":[{"b":1}]}]`, depth: 4, ok: true}, {in: `[{"a":[{"b":[]}]}]`, depth: 4, ok: false},
		// UTF-16 surrogate escapes: pairs only (jsonb, MariaDB).
		{in: `"\ud83d\ude00"`, ok: true}, {in: `"\uDBFF\uDFFF"`, ok: true}, {in: `"\\ud800"`, ok: true},
		{in: `"\ud800"`, ok: false}, {in: `"\udc00"`, ok: false}, {in: `"\udc00\ud800"`, ok: false},
		{in: `"\ud800\ud800"`, ok: false}, {in: `"\ud800\u0041"`, ok: false}, {in: `"\ud800\n"`, ok: false}, {in: `{"\udfff":1}`, ok: false},
		// PostgreSQL's numeric (experiments in docs/dialects.md).
		{in: `1e131071`, ok: true}, {in: `9.99e131071`, ok: true}, {in: `0.00000001e131079`, ok: true}, {in: `0.5e131072`, ok: true},
		{in: `1e131072`, ok: false}, {in: `10e131071`, ok: false}, {in: `0.00000001e131080`, ok: false},
		{in: `1e-16383`, ok: true}, {in: `0.1e-16382`, ok: true}, {in: `123.45e-16381`, ok: true}, {in: `-0.0e-16382`, ok: true},
		{in: `1e-16384`, ok: false}, {in: `1.0e-16383`, ok: false}, {in: `0.1e-16383`, ok: false}, {in: `123.45e-16382`, ok: false},
		{in: `0e-20000`, ok: false}, {in: `0.000e-16383`, ok: false}, {in: `-0.0e-16383`, ok: false},
		{in: `0e20000000`, ok: true}, {in: `0e1073741822`, ok: true}, {in: `0e1073741823`, ok: false}, {in: `0e99999999999999999999`, ok: false},
		{in: `1E+2`, ok: true}, {in: `-0`, ok: true},
		{in: "1" + strings.Repeat("0", 131071), ok: true}, {in: "1" + strings.Repeat("0", 131072), ok: false},
		{in: "0." + strings.Repeat("0", 16382) + "1", ok: true}, {in: "0." + strings.Repeat("0", 16383) + "1", ok: false},
		// Grammar.
		{in: `[1,]`, ok: false}, {in: `01`, ok: false}, {in: `1.`, ok: false}, {in: `.5`, ok: false}, {in: `1e`, ok: false},
		{in: `-`, ok: false}, {in: `1 2`, ok: false}, {in: `{"a"}`, ok: false}, {in: `{"a":1,}`, ok: false}, {in: `[}`, ok: false},
		{in: `"\x41"`, ok: false}, {in: `"\u12"`, ok: false}, {in: "\"a\tb\"", ok: false}, {in: `tru`, ok: false}, {in: `nul`, ok: false},
		{in: " \t\n\r[1 , {\"a\" : [true,false,null]} ] ", ok: true},
	} {
		depth := tc.depth
		if depth == 0 {
			depth = MaxPayloadDepth
		}
		reason := checkJSON([]byte(tc.in), depth)
		if got := reason == ""; got != tc.ok {
			t.Errorf("checkJSON(%.80q, %d) ok = %v, want %v (%s)", tc.in, depth, got, tc.ok, reason)
		}
	}
}

// TestCheckJSONAllocs: the check runs on every publish and allocates
// nothing for a payload it accepts.
func TestCheckJSONAllocs(t *testing.T) {
	p := []byte(`{"id":"0193a1f2","n":[1,-2.5e-3,1E+2],"s":"caf\u00e9 \ud83d\ude00 \"q\"","ok":true,"x":null}`)
	if n := testing.AllocsPerRun(100, func() {
		if r := checkJSON(p, MaxPayloadDepth); r != "" {
			t.Fatal(r)
		}
	}); n != 0 {
		t.Errorf("%v allocations per check, want 0", n)
	}
}

// TestDialectDepth: a dialect's Capabilities.MaxJSONDepth lowers the
// nesting limit, never raises it above MaxPayloadDepth.
func TestDialectDepth(t *testing.T) {
	deep := func(n int) []byte { return []byte(strings.Repeat("[", n) + strings.Repeat("]", n)) }
	for _, tc := range []struct{ caps, want int }{{0, MaxPayloadDepth}, {3, 3}, {31, 31}, {MaxPayloadDepth + 100, MaxPayloadDepth}} {
		ob, err := New(stubDialect{outboxdriver.Capabilities{MaxJSONDepth: tc.caps}}, Config{})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := ob.PublishSQL(Message{Topic: "t", Payload: deep(tc.want)}); err != nil {
			t.Errorf("MaxJSONDepth %d: %d levels refused: %v", tc.caps, tc.want, err)
		}
		var me *MessageError
		if _, err := ob.PublishSQL(Message{Topic: "t", Payload: deep(tc.want + 1)}); !errors.As(err, &me) || me.Field != "Payload" {
			t.Errorf("MaxJSONDepth %d: %d levels: %v, want a MessageError on Payload", tc.caps, tc.want+1, err)
		}
	}
}

// TestLeaseValidation: a lease under MinLease is refused; one under the
// dialect's Capabilities.MinLease too, unless renewal is off.
func TestLeaseValidation(t *testing.T) {
	floor := outboxdriver.Capabilities{}
	slow := outboxdriver.Capabilities{MinLease: 15 * time.Second}
	for _, tc := range []struct {
		caps    outboxdriver.Capabilities
		lease   time.Duration
		noRenew bool
		ok      bool
	}{
		{floor, 0, false, true}, // DefaultLease
		{floor, MinLease, false, true},
		{floor, MinLease - 1, false, false},
		{floor, MinLease - 1, true, false},
		{slow, 0, false, true},
		{slow, 15 * time.Second, false, true},
		{slow, 15*time.Second - 1, false, false},
		{slow, 2 * time.Second, false, false},
		{slow, 2 * time.Second, true, true},
		{slow, MinLease - 1, true, false},
	} {
		cfg := RelayConfig{Lease: tc.lease, DisableLeaseRenewal: tc.noRenew}
		err := cfg.validate(tc.caps)
		var ce *ConfigError
		switch {
		case tc.ok && err != nil:
			t.Errorf("MinLease %v, Lease %v, renewal off %v: %v", tc.caps.MinLease, tc.lease, tc.noRenew, err)
		case !tc.ok && (!errors.As(err, &ce) || ce.Field != "Lease"):
			t.Errorf("MinLease %v, Lease %v, renewal off %v: %v, want a ConfigError on Lease", tc.caps.MinLease, tc.lease, tc.noRenew, err)
		}
	}
}
