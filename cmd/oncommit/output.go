package main

import (
	"encoding/json"
	"fmt"
	"io"
	"slices"
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
// per line. A table's cells go through printable; a table's rows are kept
// until flush, which drops the optional columns that are empty in every
// row (see optional).
type out struct {
	w      io.Writer
	asJSON bool
	enc    *json.Encoder
	header []string
	rows   [][]string
	// opt marks the optional columns.
	opt []bool
	// done: the table is written.
	done bool
	err  error
}

func newOut(w io.Writer, asJSON bool, header ...any) *out {
	o := &out{w: w, asJSON: asJSON}
	if asJSON {
		o.enc = json.NewEncoder(w)
		return o
	}
	o.header = o.strings(header)
	o.opt = make([]bool, len(header))
	return o
}

// optional makes the column named name (in the header) one a table
// shows only when some row has a cell in it that is not empty.
func (o *out) optional(name string) {
	for i, h := range o.header {
		if h == name {
			o.opt[i] = true
		}
	}
}

func (o *out) strings(cells []any) []string {
	s := make([]string, len(cells))
	for i, c := range cells {
		s[i] = printable(fmt.Sprint(c), false)
	}
	return s
}

// row writes obj as JSON, or cells as a table row.
func (o *out) row(obj map[string]any, cells ...any) {
	if o.asJSON {
		if err := o.enc.Encode(obj); err != nil && o.err == nil {
			o.err = err
		}
		return
	}
	o.rows = append(o.rows, o.strings(cells))
}

// flush writes the table (once), without the optional columns empty in
// every row; it returns the first error of a JSON row.
func (o *out) flush() error {
	if o.asJSON || o.done {
		return o.err
	}
	o.done = true
	show := make([]bool, len(o.header))
	for i := range show {
		show[i] = !o.opt[i] || slices.ContainsFunc(o.rows, func(r []string) bool { return i < len(r) && r[i] != "" })
	}
	tw := tabwriter.NewWriter(o.w, 0, 4, 2, ' ', 0)
	for _, r := range append([][]string{o.header}, o.rows...) {
		var cells []string
		for i, c := range r {
			if i >= len(show) || show[i] {
				cells = append(cells, c)
			}
		}
		fmt.Fprintln(tw, strings.Join(cells, "\t"))
	}
	return tw.Flush()
}
