package outbox

import (
	"bytes"
	"errors"
	"sort"
	"strings"
	"testing"
)

type stubDialect struct{ caps Capabilities }

func (stubDialect) Name() string                              { return "stub" }
func (s stubDialect) Capabilities() Capabilities              { return s.caps }
func (stubDialect) Insert(Table, []Row, Wake) (string, []any) { return "", nil }
func (stubDialect) Classify(err error) error                  { return err }

func TestConfigValidation(t *testing.T) {
	pg := stubDialect{Capabilities{Notify: true, MaxParams: 65535, ParamsPerRow: 7}}
	quiet := stubDialect{Capabilities{MaxParams: 999, ParamsPerRow: 7}}
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
		{"negative notify interval", pg, Config{NotifyInterval: -1}, "NotifyInterval"},
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
		in string
		ok bool
	}{
		{`null`, true}, {`{}`, true}, {`"a\\u0000"`, true}, {`"\\"`, true}, {`"\"{["`, true},
		{deep(MaxPayloadDepth), true}, {`{"a":[1,{"b":"\u00e9"}]}`, true},
		{`"\u0000"`, false}, {`"x\\\u0000"`, false}, {deep(MaxPayloadDepth + 1), false},
		{`{`, false}, {`NaN`, false}, {`Infinity`, false}, {"\"\xc3\x28\"", false}, {``, false},
	} {
		if got := checkJSON([]byte(tc.in)) == ""; got != tc.ok {
			t.Errorf("checkJSON(%q) ok = %v, want %v (%s)", tc.in, got, tc.ok, checkJSON([]byte(tc.in)))
		}
	}
}
