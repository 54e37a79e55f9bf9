package main

import (
	"encoding/json"
	"fmt"
	"io"
	"text/tabwriter"
)

// out writes rows as an aligned table with a header, or as one JSON object
// per line.
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
		fmt.Fprint(o.tw, c)
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
