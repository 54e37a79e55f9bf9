package main

import (
	"fmt"
	"image"
	"image/color"
	"image/draw"
	"image/png"
	"math"
	"os"
	"slices"

	"golang.org/x/image/font"
	"golang.org/x/image/font/basicfont"
	"golang.org/x/image/math/fixed"
)

// writeChart draws the throughput scenarios as grouped bars, one group per
// scenario and one bar per system, each bar the system's median throughput
// as a multiple of the raw reference's (raw = 1), its value written on top.
func writeChart(path string, res *results, scenarios []string) error {
	colours := map[string]color.RGBA{
		"raw":                 {0x55, 0x55, 0x55, 0xff},
		"oncommit":            {0x1f, 0x77, 0xb4, 0xff},
		"oncommit-notify-off": {0x6b, 0xae, 0xd6, 0xff},
		"oncommit-best":       {0x17, 0x3f, 0x8f, 0xff},
		"river":               {0xd6, 0x27, 0x28, 0xff},
		"river-best":          {0xff, 0x98, 0x96, 0xff},
		"gue":                 {0x2c, 0xa0, 0x2c, 0xff},
		"gue-best":            {0x98, 0xdf, 0x8a, 0xff},
	}
	colour := func(name string) *image.Uniform {
		if c, ok := colours[name]; ok {
			return image.NewUniform(c)
		}
		return image.NewUniform(color.RGBA{0x99, 0x66, 0xcc, 0xff})
	}
	var systems []string
	seen := map[string]bool{}
	top := 1.0
	for _, k := range res.order {
		s := res.by[k]
		if !slices.Contains(scenarios, s.scenario) {
			continue
		}
		if !seen[s.system] {
			seen[s.system] = true
			systems = append(systems, s.system)
		}
		top = math.Max(top, res.ratio(s))
	}
	top = math.Ceil(top*4) / 4

	const w, h, left, right, bottom, topMargin = 1200, 560, 60, 20, 60, 80
	img := image.NewRGBA(image.Rect(0, 0, w, h))
	draw.Draw(img, img.Bounds(), image.White, image.Point{}, draw.Src)
	black := image.NewUniform(color.Black)
	grey := image.NewUniform(color.RGBA{0xdd, 0xdd, 0xdd, 0xff})
	text := func(x, y int, s string) {
		d := font.Drawer{Dst: img, Src: black, Face: basicfont.Face7x13, Dot: fixed.P(x, y)}
		d.DrawString(s)
	}
	textCentred := func(x, y int, s string) { text(x-len(s)*7/2, y, s) }
	plotH := h - topMargin - bottom
	yOf := func(v float64) int { return h - bottom - int(v/top*float64(plotH)) }

	text(left, 20, "Throughput as a multiple of the raw-SQL reference (raw = 1.00), median of rounds; higher is better")
	for v := 0.0; v <= top+1e-9; v += 0.25 {
		y := yOf(v)
		draw.Draw(img, image.Rect(left, y, w-right, y+1), grey, image.Point{}, draw.Src)
		text(8, y+4, fmt.Sprintf("%.2fx", v))
	}
	// legend
	x := left
	for _, name := range systems {
		draw.Draw(img, image.Rect(x, 38, x+12, 50), colour(name), image.Point{}, draw.Src)
		text(x+16, 49, name)
		x += 16 + len(name)*7 + 20
	}
	groupW := (w - left - right) / len(scenarios)
	barW := (groupW - 30) / max(1, len(systems))
	for g, sc := range scenarios {
		gx := left + g*groupW + 15
		for i, name := range systems {
			s := res.get(sc, name)
			if s == nil {
				continue
			}
			r := 1.0
			if name != "raw" {
				r = res.ratio(s)
			}
			bx := gx + i*barW
			draw.Draw(img, image.Rect(bx+2, yOf(r), bx+barW-2, h-bottom), colour(name), image.Point{}, draw.Src)
			textCentred(bx+barW/2, yOf(r)-4, fmt.Sprintf("%.2f", r))
		}
		textCentred(gx+len(systems)*barW/2, h-bottom+20, sc)
		if raw := res.get(sc, "raw"); raw != nil {
			textCentred(gx+len(systems)*barW/2, h-bottom+36, fmt.Sprintf("raw = %s msg/s", num(median(raw.vals))))
		}
	}
	draw.Draw(img, image.Rect(left, h-bottom, w-right, h-bottom+1), black, image.Point{}, draw.Src)

	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := png.Encode(f, img); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
