package dashboard

import (
	"strconv"
	"strings"
	"time"
)

// chart is the queue depth over the last hour as an SVG polyline, drawn
// on the server (no script).
type chart struct {
	W, H, Right, Bottom int
	Points              string
	Max                 int64
	Samples             int
	Span, Every         time.Duration
}

// newChart places the samples of the last hour before now on a W x H
// plot: time on x (an hour ago at the left, now at the right), depth on y.
func newChart(s []sample, now time.Time, every time.Duration) *chart {
	c := &chart{W: 600, H: 140, Samples: len(s), Span: time.Hour, Every: every}
	c.Right, c.Bottom = c.W-4, c.H-4
	for _, p := range s {
		c.Max = max(c.Max, p.n)
	}
	if len(s) == 1 { // one point draws nothing: a short level line
		s = []sample{{s[0].at.Add(-every), s[0].n}, s[0]}
	}
	top := max(c.Max, 1)
	var b strings.Builder
	for i, p := range s {
		age := now.Sub(p.at)
		x := float64(c.W-8)*(1-float64(age)/float64(time.Hour)) + 4
		y := float64(c.H-24)*(1-float64(p.n)/float64(top)) + 16
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(strconv.FormatFloat(x, 'f', 1, 64) + "," + strconv.FormatFloat(y, 'f', 1, 64))
	}
	c.Points = b.String()
	return c
}
