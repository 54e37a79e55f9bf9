package outbox_test

import (
	"encoding/json"
	"math/big"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/oncommit/oncommit/internal/dialecttest"
	"github.com/oncommit/oncommit/outbox"
)

// FuzzCheckJSON compares the payload check with a slow reference written
// from the rules in docs/dialects.md ("Payloads"): encoding/json's Valid
// for the grammar, then the escapes, numbers (with math/big) and depth.
// No database: FuzzPayload checks the rules against the servers.
//
//	go test ./outbox -run '^$' -fuzz FuzzCheckJSON -fuzztime 60s
func FuzzCheckJSON(f *testing.F) {
	dialecttest.AddSeeds(f)
	f.Fuzz(func(t *testing.T, p []byte) {
		for _, depth := range []int{31, outbox.MaxPayloadDepth} {
			reason := outbox.CheckJSON(p, depth)
			if want := referenceOK(p, depth); (reason == "") != want {
				t.Fatalf("checkJSON(%.200q, %d) = %q, reference accepts: %v", p, depth, reason, want)
			}
		}
	})
}

func referenceOK(p []byte, maxDepth int) bool {
	if !utf8.Valid(p) || !json.Valid(p) {
		return false
	}
	depth := 0
	for i := 0; i < len(p); {
		switch c := p[i]; {
		case c == '"':
			// The string's UTF-16 units written as \u escapes, -1 for
			// anything else.
			var units []int
			j := i + 1
			for p[j] != '"' {
				switch {
				case p[j] == '\\' && p[j+1] == 'u':
					u, _ := strconv.ParseUint(string(p[j+2:j+6]), 16, 32)
					units = append(units, int(u))
					j += 6
				case p[j] == '\\':
					units = append(units, -1)
					j += 2
				default:
					units = append(units, -1)
					j++
				}
			}
			for k := 0; k < len(units); k++ {
				u := units[k]
				high := u >= 0xd800 && u <= 0xdbff
				switch {
				case u == 0:
					return false
				case high && k+1 < len(units) && units[k+1] >= 0xdc00 && units[k+1] <= 0xdfff:
					k++
				case u >= 0xd800 && u <= 0xdfff:
					return false
				}
			}
			i = j + 1
		case c == '-' || c >= '0' && c <= '9':
			j := i
			for j < len(p) && strings.IndexByte("+-.eE0123456789", p[j]) >= 0 {
				j++
			}
			if !numericHolds(string(p[i:j])) {
				return false
			}
			i = j
		case c == '[' || c == '{':
			if depth++; depth > maxDepth {
				return false
			}
			i++
		case c == ']' || c == '}':
			depth--
			i++
		default:
			i++
		}
	}
	return true
}

// numericHolds reports whether PostgreSQL's numeric holds the JSON number
// s: exponent as written within ±(2^30-1) exclusive, at most 16383 digits
// after the decimal point (as written, shifted by the exponent), and a
// nonzero value with at most 131072 digits before it.
func numericHolds(s string) bool {
	mant, expText, _ := strings.Cut(strings.ToLower(strings.TrimPrefix(s, "-")), "e")
	exp := new(big.Int)
	if expText != "" {
		exp.SetString(strings.TrimPrefix(expText, "+"), 10)
	}
	limit := big.NewInt(1<<30 - 1)
	if new(big.Int).Abs(exp).Cmp(limit) >= 0 {
		return false
	}
	intPart, frac, _ := strings.Cut(mant, ".")
	scale := new(big.Int).Sub(big.NewInt(int64(len(frac))), exp)
	if scale.Cmp(big.NewInt(16383)) > 0 {
		return false
	}
	all := intPart + frac
	z := strings.IndexFunc(all, func(r rune) bool { return r != '0' })
	if z < 0 {
		return true // zero
	}
	intDigits := new(big.Int).Add(big.NewInt(int64(len(intPart)-z)), exp)
	return intDigits.Cmp(big.NewInt(131072)) <= 0
}
