package outbox

import (
	"strconv"
	"unicode/utf8"
)

// The JSON columns' limits that checkJSON enforces beyond RFC 8259, found by
// experiment on the servers (docs/dialects.md, "Payloads"). A number is
// refused when PostgreSQL's numeric cannot hold it (jsonb stores numbers as
// numeric, SQLSTATE 22003 otherwise).
const (
	// numericIntDigits is the most digits a nonzero number may have before
	// its decimal point, once its exponent is applied (weight of 32767 in
	// base 10000): 1e131071 is stored, 10e131071 is refused.
	numericIntDigits = 131072
	// numericScale is the most digits after the decimal point, counted as
	// written (trailing zeros included) once the exponent is applied, for
	// zero as well: 1e-16383 and 0.1e-16382 are stored, 1.0e-16383 and
	// 0e-16384 are refused.
	numericScale = 16383
	// numericExponent bounds the exponent as written, whatever the
	// mantissa: 0e1073741822 is stored, 0e1073741823 is refused (PostgreSQL
	// refuses exponents of INT_MAX/2 and beyond before looking at the value).
	numericExponent = 1<<30 - 1
)

// Reasons checkJSON gives. They are constants so that the happy path never
// builds a string.
const (
	reasonUTF8      = "not valid UTF-8"
	reasonJSON      = "not valid JSON"
	reasonNUL       = `contains the \u0000 escape, which JSON columns refuse`
	reasonSurrogate = `contains a UTF-16 surrogate escape (\ud800 to \udfff) that is not a high one followed by a low one, which JSON columns refuse`
	reasonNumber    = "contains a number outside the range of PostgreSQL's numeric " +
		"(at most 131072 digits before the decimal point and 16383 after it, trailing zeros included, exponent below 1073741823)"
)

// checkJSON returns why p cannot be stored in the JSON column of every
// supported dialect whose nesting limit is maxDepth (at most
// MaxPayloadDepth), or "" when it can. It reads p once and allocates
// nothing unless it refuses p for its depth.
//
// It accepts exactly RFC 8259 JSON text in UTF-8 (what encoding/json's
// Valid accepts) and refuses, beyond that: the \u0000 escape (jsonb),
// \u escapes of UTF-16 surrogates other than a high one followed by a low
// one (jsonb, MariaDB's JSON_VALID), numbers PostgreSQL's numeric cannot
// hold (jsonb), and nesting deeper than maxDepth.
func checkJSON(p []byte, maxDepth int) string {
	if !utf8.Valid(p) {
		return reasonUTF8
	}
	// inObject[d/64] bit d%64 is set when the container at depth d+1 is an
	// object.
	var inObject [MaxPayloadDepth / 64]uint64
	depth := 0
	i := skipSpace(p, 0)
	for {
		// A value starts at i.
		if i >= len(p) {
			return reasonJSON
		}
		reason := ""
		switch c := p[i]; {
		case c == '{' || c == '[':
			if depth == maxDepth {
				return "nested deeper than " + strconv.Itoa(maxDepth) + " levels"
			}
			w, bit := depth/64, uint64(1)<<(depth%64)
			depth++
			i = skipSpace(p, i+1)
			if c == '[' {
				inObject[w] &^= bit
				if i < len(p) && p[i] == ']' {
					i++
					depth--
					break
				}
				continue
			}
			inObject[w] |= bit
			if i < len(p) && p[i] == '}' {
				i++
				depth--
				break
			}
			if i, reason = member(p, i); reason != "" {
				return reason
			}
			continue
		case c == '"':
			i, reason = scanString(p, i)
		case c == '-' || c >= '0' && c <= '9':
			i, reason = scanNumber(p, i)
		case c == 't':
			i, reason = literal(p, i, "true")
		case c == 'f':
			i, reason = literal(p, i, "false")
		case c == 'n':
			i, reason = literal(p, i, "null")
		default:
			return reasonJSON
		}
		if reason != "" {
			return reason
		}
		// A value ended at i: close containers until one goes on.
		for {
			i = skipSpace(p, i)
			if depth == 0 {
				if i != len(p) {
					return reasonJSON
				}
				return ""
			}
			if i >= len(p) {
				return reasonJSON
			}
			obj := inObject[(depth-1)/64]&(1<<((depth-1)%64)) != 0
			if c := p[i]; c == ',' {
				i = skipSpace(p, i+1)
				if obj {
					if i, reason = member(p, i); reason != "" {
						return reason
					}
				}
				break
			} else if obj && c == '}' || !obj && c == ']' {
				i++
				depth--
				continue
			}
			return reasonJSON
		}
	}
}

// skipSpace returns the index of the first byte at or after i that is not
// JSON white space.
func skipSpace(p []byte, i int) int {
	for i < len(p) && (p[i] == ' ' || p[i] == '\n' || p[i] == '\r' || p[i] == '\t') {
		i++
	}
	return i
}

// member reads an object member's name and colon at i and returns where
// its value starts.
func member(p []byte, i int) (int, string) {
	if i >= len(p) || p[i] != '"' {
		return i, reasonJSON
	}
	i, reason := scanString(p, i)
	if reason != "" {
		return i, reason
	}
	if i = skipSpace(p, i); i >= len(p) || p[i] != ':' {
		return i, reasonJSON
	}
	return skipSpace(p, i+1), ""
}

func literal(p []byte, i int, lit string) (int, string) {
	if len(p)-i < len(lit) || string(p[i:i+len(lit)]) != lit {
		return i, reasonJSON
	}
	return i + len(lit), ""
}

// scanString reads the string that starts at p[i] == '"' (p is valid
// UTF-8) and returns the index after its closing quote.
func scanString(p []byte, i int) (int, string) {
	for i++; i < len(p); i++ {
		switch c := p[i]; {
		case c == '"':
			return i + 1, ""
		case c < 0x20:
			return i, reasonJSON
		case c != '\\':
		case i+1 >= len(p):
			return i, reasonJSON
		case p[i+1] != 'u':
			switch p[i+1] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				i++
			default:
				return i, reasonJSON
			}
		default:
			r := hex4(p, i+2)
			switch {
			case r < 0:
				return i, reasonJSON
			case r == 0:
				return i, reasonNUL
			case r >= 0xdc00 && r <= 0xdfff:
				return i, reasonSurrogate
			case r >= 0xd800 && r <= 0xdbff:
				if i+7 >= len(p) || p[i+6] != '\\' || p[i+7] != 'u' {
					return i, reasonSurrogate
				}
				if lo := hex4(p, i+8); lo < 0xdc00 || lo > 0xdfff {
					return i, reasonSurrogate
				}
				i += 6
			}
			i += 5
		}
	}
	return i, reasonJSON
}

// hex4 returns the value of the four hex digits at p[i:], or -1.
func hex4(p []byte, i int) rune {
	if i+4 > len(p) {
		return -1
	}
	var r rune
	for _, c := range p[i : i+4] {
		switch {
		case c >= '0' && c <= '9':
			c -= '0'
		case c >= 'a' && c <= 'f':
			c -= 'a' - 10
		case c >= 'A' && c <= 'F':
			c -= 'A' - 10
		default:
			return -1
		}
		r = r<<4 | rune(c)
	}
	return r
}

// scanNumber reads the number that starts at p[i] and returns the index
// after it; it refuses numbers PostgreSQL's numeric cannot hold.
func scanNumber(p []byte, i int) (int, string) {
	if p[i] == '-' {
		i++
	}
	intStart := i
	switch {
	case i >= len(p):
		return i, reasonJSON
	case p[i] == '0':
		i++
	case p[i] >= '1' && p[i] <= '9':
		i = digits(p, i)
	default:
		return i, reasonJSON
	}
	intEnd, fracStart, fracEnd := i, i, i
	if i < len(p) && p[i] == '.' {
		fracStart = i + 1
		if i = digits(p, fracStart); i == fracStart {
			return i, reasonJSON
		}
		fracEnd = i
	}
	exp := 0
	if i < len(p) && (p[i] == 'e' || p[i] == 'E') {
		i++
		neg := i < len(p) && p[i] == '-'
		if i < len(p) && (p[i] == '-' || p[i] == '+') {
			i++
		}
		start := i
		for ; i < len(p) && p[i] >= '0' && p[i] <= '9'; i++ {
			if exp <= numericExponent {
				exp = exp*10 + int(p[i]-'0')
			}
		}
		if i == start {
			return i, reasonJSON
		}
		if exp >= numericExponent {
			return i, reasonNumber
		}
		if neg {
			exp = -exp
		}
	}
	if fracEnd-fracStart-exp > numericScale {
		return i, reasonNumber
	}
	// intDigits: the digits of the value before its decimal point,
	// counted from its first nonzero digit (zero has none).
	intDigits := intEnd - intStart + exp
	if p[intStart] == '0' {
		j := fracStart
		for j < fracEnd && p[j] == '0' {
			j++
		}
		if j == fracEnd {
			return i, ""
		}
		intDigits = exp - (j - fracStart)
	}
	if intDigits > numericIntDigits {
		return i, reasonNumber
	}
	return i, ""
}

func digits(p []byte, i int) int {
	for i < len(p) && p[i] >= '0' && p[i] <= '9' {
		i++
	}
	return i
}
