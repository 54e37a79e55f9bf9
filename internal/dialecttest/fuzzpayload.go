package dialecttest

import (
	"bytes"
	"context"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/big"
	"path"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/oncommit/oncommit/outbox"
	"github.com/oncommit/oncommit/outboxdriver"
)

// seeds is the shared seed corpus of FuzzPayload, in the Go corpus file
// format: the five payloads of issues 12 and 19, surrogate pairs, number
// range edges, nesting at each dialect's limit, \u0000, invalid UTF-8.
//
//go:embed testdata/fuzz/FuzzPayload
var seeds embed.FS

// AddSeeds adds the shared payload corpus to f. Inputs that `go test -fuzz`
// finds land in the calling package's own testdata/fuzz, which Go runs as
// well.
func AddSeeds(f *testing.F) {
	const dir = "testdata/fuzz/FuzzPayload"
	files, err := seeds.ReadDir(dir)
	if err != nil {
		f.Fatal(err)
	}
	for _, file := range files {
		b, err := seeds.ReadFile(path.Join(dir, file.Name()))
		if err != nil {
			f.Fatal(err)
		}
		p, err := parseCorpusFile(b)
		if err != nil {
			f.Fatalf("%s: %v", file.Name(), err)
		}
		f.Add(p)
	}
}

// parseCorpusFile reads a corpus file holding one []byte value.
func parseCorpusFile(b []byte) ([]byte, error) {
	rest, ok := bytes.CutPrefix(b, []byte("go test fuzz v1\n"))
	if !ok {
		return nil, errors.New("not a go test fuzz v1 file")
	}
	lit, open := strings.CutPrefix(strings.TrimSpace(string(rest)), "[]byte(")
	lit, closed := strings.CutSuffix(lit, ")")
	if !open || !closed {
		return nil, errors.New("not one []byte value")
	}
	s, err := strconv.Unquote(lit)
	return []byte(s), err
}

// FuzzPayload checks, on every harness, that each payload is either refused
// by Publish with a *outbox.MessageError, after which the caller's
// transaction still commits a following business INSERT, or stored and
// claimed back JSON-equal (numbers compared as exact decimals, objects as
// maps whose last duplicate key wins). The payload is the second message
// of a PublishBatch: refusing it must send nothing, so the first is not
// stored either. Each harness gets one store for the whole run, emptied
// after every input.
func FuzzPayload(f *testing.F, hs ...Harness) {
	AddSeeds(f)
	envs := make([]*env, len(hs))
	for i, h := range hs {
		envs[i] = newEnv(f, h)
	}
	f.Fuzz(func(t *testing.T, payload []byte) {
		for i, e := range envs {
			roundTrip(t, fmt.Sprintf("%s (harness %d)", hs[i].Dialect.Name(), i), e, payload)
		}
	})
}

func roundTrip(t *testing.T, name string, e *env, payload []byte) {
	t.Helper()
	s, ob := e.Store, e.ob
	ctx := context.Background()
	short := fmt.Sprintf("%.200q", payload)
	tx := s.Begin(t)
	res, err := ob.PublishBatch(ctx, tx.Tx, []outbox.Message{
		{Topic: "fuzz.first", Payload: []byte(`{"first":true}`)},
		{Topic: "fuzz", Payload: payload},
	})
	var me *outbox.MessageError
	refused := errors.As(err, &me)
	if err != nil && !refused {
		t.Fatalf("%s: payload %s: PublishBatch: %v, not a *outbox.MessageError", name, short, err)
	}
	if refused && (me.Index != 1 || me.Field != "Payload" || me.Reason == "") {
		t.Fatalf("%s: payload %s: refused as %#v, want message 1's Payload", name, short, me)
	}
	business := outbox.NewID().String()
	if err := tx.Tx.ExecTx(ctx, `INSERT INTO `+s.Table+` (id, topic) VALUES ('`+business+`', 'fuzz.business')`); err != nil {
		t.Fatalf("%s: payload %s (refused: %v): business INSERT on the same transaction: %v", name, short, refused, err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatalf("%s: payload %s: commit: %v", name, short, err)
	}
	defer func() {
		rows, err := s.DB.QueryDB(ctx, `DELETE FROM `+s.Table)
		if err == nil {
			err = rows.Close()
		}
		if err != nil {
			t.Fatalf("%s: emptying the table: %v", name, err)
		}
	}()
	if n := s.Count(t, "id = '"+business+"'"); n != 1 {
		t.Fatalf("%s: payload %s: business row stored %d times, want 1", name, short, n)
	}
	if refused {
		if n := s.Count(t, ""); n != 1 {
			t.Fatalf("%s: payload %s refused (%s), yet %d rows stored, want only the business row", name, short, me.Reason, n)
		}
		return
	}
	cs, _, err := e.rd.Claim(ctx, s.DB, ob.Table(), outboxdriver.ClaimParams{Topics: []string{"fuzz"}, Limit: 10, Lease: time.Minute, MaxAttempts: 3})
	if err != nil {
		t.Fatalf("%s: payload %s: claim: %v", name, short, err)
	}
	if len(cs) != 1 || cs[0].ID != res[1].ID {
		t.Fatalf("%s: payload %s: claimed %v, want the one message %s", name, short, cs, res[1].ID)
	}
	if len(payload) == 0 {
		if cs[0].Payload != nil {
			t.Fatalf("%s: empty payload read back as %q, want NULL", name, cs[0].Payload)
		}
		return
	}
	if err := JSONEqual(payload, cs[0].Payload); err != nil {
		t.Fatalf("%s: payload %s read back as %.200q: %v", name, short, cs[0].Payload, err)
	}
}

// JSONEqual returns nil when a and b are the same JSON value: objects
// compared as maps in which the last of duplicate names wins (as jsonb
// keeps it), numbers as exact decimal values (jsonb writes 1e2 as 100).
func JSONEqual(a, b []byte) error {
	va, err := decodeJSON(a)
	if err != nil {
		return fmt.Errorf("first: %w", err)
	}
	vb, err := decodeJSON(b)
	if err != nil {
		return fmt.Errorf("second: %w", err)
	}
	return equalValues("$", va, vb)
}

func decodeJSON(p []byte) (any, error) {
	d := json.NewDecoder(bytes.NewReader(p))
	d.UseNumber()
	var v any
	if err := d.Decode(&v); err != nil {
		return nil, err
	}
	if _, err := d.Token(); err != io.EOF {
		return nil, fmt.Errorf("data after the value")
	}
	return v, nil
}

func equalValues(at string, a, b any) error {
	switch a := a.(type) {
	case map[string]any:
		b, ok := b.(map[string]any)
		if !ok || len(a) != len(b) {
			return fmt.Errorf("%s: object of %d names against %T %v", at, len(a), b, b)
		}
		for k, va := range a {
			vb, ok := b[k]
			if !ok {
				return fmt.Errorf("%s: name %q missing", at, k)
			}
			if err := equalValues(at+"."+strconv.Quote(k), va, vb); err != nil {
				return err
			}
		}
		return nil
	case []any:
		b, ok := b.([]any)
		if !ok || len(a) != len(b) {
			return fmt.Errorf("%s: array of %d against %T", at, len(a), b)
		}
		for i := range a {
			if err := equalValues(at+"["+strconv.Itoa(i)+"]", a[i], b[i]); err != nil {
				return err
			}
		}
		return nil
	case json.Number:
		b, ok := b.(json.Number)
		if !ok {
			return fmt.Errorf("%s: number %.50s against %T", at, a, b)
		}
		da, err := decimalOf(string(a))
		if err != nil {
			return err
		}
		db, err := decimalOf(string(b))
		if err != nil {
			return err
		}
		if da != db {
			return fmt.Errorf("%s: number %.50s against %.50s", at, a, b)
		}
		return nil
	default: // string, bool, nil
		if a != b {
			return fmt.Errorf("%s: %.50q against %.50q", at, a, b)
		}
		return nil
	}
}

// decimal is the exact value of a JSON number: digits (no leading or
// trailing zeros; empty for zero, which has no sign) times 10^exp, the
// exponent in decimal (any size: SQLite and MariaDB keep 0e99999999999999999999).
type decimal struct {
	neg         bool
	digits, exp string
}

func decimalOf(s string) (decimal, error) {
	mant, expText, _ := strings.Cut(strings.ToLower(s), "e")
	exp := new(big.Int)
	if expText != "" {
		if _, ok := exp.SetString(strings.TrimPrefix(expText, "+"), 10); !ok {
			return decimal{}, fmt.Errorf("number %.50s: bad exponent", s)
		}
	}
	mant, neg := strings.CutPrefix(mant, "-")
	intPart, frac, _ := strings.Cut(mant, ".")
	digits := strings.TrimLeft(intPart+frac, "0")
	trimmed := strings.TrimRight(digits, "0")
	if trimmed == "" {
		return decimal{}, nil
	}
	exp.Add(exp, big.NewInt(int64(len(digits)-len(trimmed)-len(frac))))
	return decimal{neg, trimmed, exp.String()}, nil
}
