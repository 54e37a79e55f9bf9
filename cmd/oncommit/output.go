package main

import (
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"unicode"
	"unicode/utf8"
)

// printable returns s with its control characters (ESC, CR, BEL, tab, the
// C1 controls such as U+009B) and its invalid UTF-8 bytes written as Go
// escapes (\x1b, \r, \u009b, \xff), so that text from messages cannot
// drive the operator's terminal; keepNL keeps newlines (of a multi-line
// payload) as they are.
func printable(s string, keepNL bool) string {
	var b strings.Builder
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && n == 1:
			fmt.Fprintf(&b, `\x%02x`, s[i])
		case unicode.IsControl(r) && !(keepNL && r == '\n'):
			q := strconv.QuoteRune(r)
			b.WriteString(q[1 : len(q)-1])
		default:
			b.WriteString(s[i : i+n])
		}
		i += n
	}
	return b.String()
}

// out writes rows as an aligned table with a header, or as one JSON object
// per line. A table's cells go through printable.
type out struct {
	w      io.Writer
	asJSON bool
	tw     *tabwriter.Writer
	enc    *json.Encoder
	err    error
}

func newOut(w io.Writer, asJSON bool, header ...any) *out {
	o := &out{w: w, asJSON: asJSON}
	if asJSON {
		o.enc = json.NewEncoder(w)
		return o
	}
	o.tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	o.cells(header...)
	return o
}

func (o *out) cells(cells ...any) {
	for i, c := range cells {
		if i > 0 {
			fmt.Fprint(o.tw, "\t")
		}
		fmt.Fprint(o.tw, printable(fmt.Sprint(c), false))
	}
	fmt.Fprintln(o.tw)
}

// row writes obj as JSON, or cells as a table row.
func (o *out) row(obj map[string]any, cells ...any) {
	if o.asJSON {
		if err := o.enc.Encode(obj); err != nil && o.err == nil {
			o.err = err
		}
		return
	}
	o.cells(cells...)
}

func (o *out) flush() error {
	if o.tw != nil {
		if err := o.tw.Flush(); err != nil {
			return err
		}
	}
	return o.err
}
