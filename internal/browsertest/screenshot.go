package browsertest

import (
	"bytes"
	"fmt"
	"image"
	"image/png"
)

// A screenshot of a page that rendered, and rendered with its styles, has
// at least MinInk of its pixels away from the background colour and at
// least MinColour of them coloured (a styled header, badges, buttons). A
// blank page, an error message in plain text or a page whose stylesheet did
// not load has less.
const (
	MinInk    = 0.02
	MinColour = 0.01
)

// ScreenshotStats is what CheckScreenshot measured.
type ScreenshotStats struct {
	Width, Height int
	Ink           float64 // share of pixels that differ from the background
	Colour        float64 // share of pixels that are clearly coloured, not grey
}

// MeasureScreenshot decodes a PNG and measures it. The background is the
// colour of the most pixels.
func MeasureScreenshot(data []byte) (ScreenshotStats, error) {
	img, err := png.Decode(bytes.NewReader(data))
	if err != nil {
		return ScreenshotStats{}, fmt.Errorf("decode the screenshot: %w", err)
	}
	b := img.Bounds()
	s := ScreenshotStats{Width: b.Dx(), Height: b.Dy()}
	total := b.Dx() * b.Dy()
	if total == 0 {
		return s, nil
	}
	counts := map[[3]uint8]int{}
	var coloured int
	for y := b.Min.Y; y < b.Max.Y; y++ {
		for x := b.Min.X; x < b.Max.X; x++ {
			c := rgb(img, x, y)
			counts[c]++
			if spread(c) > 48 {
				coloured++
			}
		}
	}
	var background int
	for _, n := range counts {
		background = max(background, n)
	}
	s.Ink = float64(total-background) / float64(total)
	s.Colour = float64(coloured) / float64(total)
	return s, nil
}

func rgb(img image.Image, x, y int) [3]uint8 {
	r, g, b, _ := img.At(x, y).RGBA()
	return [3]uint8{uint8(r >> 8), uint8(g >> 8), uint8(b >> 8)}
}

// spread is how far a colour is from grey.
func spread(c [3]uint8) int {
	return int(max(c[0], c[1], c[2])) - int(min(c[0], c[1], c[2]))
}

// CheckScreenshot returns an error when data is not the screenshot of a
// page that rendered with its styles (see MinInk and MinColour).
func CheckScreenshot(data []byte) (ScreenshotStats, error) {
	s, err := MeasureScreenshot(data)
	if err != nil {
		return s, err
	}
	switch {
	case s.Width == 0 || s.Height == 0:
		return s, fmt.Errorf("the screenshot is empty (%dx%d)", s.Width, s.Height)
	case s.Ink < MinInk:
		return s, fmt.Errorf("the page looks blank: %.2f%% of the pixels differ from the background, want at least %.0f%%", 100*s.Ink, 100*MinInk)
	case s.Colour < MinColour:
		return s, fmt.Errorf("the page looks unstyled: %.2f%% of the pixels are coloured, want at least %.0f%%", 100*s.Colour, 100*MinColour)
	}
	return s, nil
}
