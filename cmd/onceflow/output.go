package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"unicode"
	"unicode/utf16"
	"unicode/utf8"
)

// writeJSON writes v as indented JSON in which every character a terminal
// could act on is a \u escape (see jsonPrintable).
func writeJSON(w io.Writer, v any) error {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		return err
	}
	_, err := w.Write(jsonPrintable(b.Bytes()))
	return err
}

// jsonPrintable escapes, in encoded JSON, the characters encoding/json
// leaves as they are although a terminal acts on them: DEL, the C1 controls
// (U+0080 to U+009F, which include an 8-bit CSI), and format characters such
// as U+202E, which reverses the text after it; invalid UTF-8 becomes
// U+FFFD. Outside strings, the encoder writes only spaces and newlines, so
// every character escaped here is inside a string, where \u is valid.
func jsonPrintable(b []byte) []byte {
	out := make([]byte, 0, len(b))
	for len(b) > 0 {
		r, size := utf8.DecodeRune(b)
		switch {
		case r == '\n' || (r != utf8.RuneError || size > 1) && unicode.IsPrint(r):
			out = append(out, b[:size]...)
		case r == utf8.RuneError:
			out = append(out, `\ufffd`...)
		default:
			for _, u := range utf16.Encode([]rune{r}) {
				out = fmt.Appendf(out, `\u%04x`, u)
			}
		}
		b = b[size:]
	}
	return out
}

// printable returns s with every character that is not printable (controls,
// including tab and newline, format characters, invalid UTF-8 bytes)
// written as a Go escape, such as \x1b or \u202e: stored requests,
// responses and errors come from clients, and must not reach a terminal as
// the escape sequences they may hold.
func printable(s string) string {
	var b strings.Builder
	for i, r := range s {
		switch {
		case r == utf8.RuneError && len(s[i:]) > 0 && !strings.HasPrefix(s[i:], "\uFFFD"):
			fmt.Fprintf(&b, `\x%02x`, s[i])
		case unicode.IsPrint(r):
			b.WriteRune(r)
		default:
			q := strconv.QuoteRune(r)
			b.WriteString(q[1 : len(q)-1])
		}
	}
	return b.String()
}

// table writes aligned columns.
type table struct{ w *tabwriter.Writer }

func newTable(w io.Writer, header ...string) *table {
	t := &table{w: tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)}
	t.row(header...)
	return t
}

// row writes one row; each cell is made printable, which also keeps tabs
// and newlines from breaking the columns.
func (t *table) row(cells ...string) {
	for i, c := range cells {
		cells[i] = printable(c)
	}
	fmt.Fprintln(t.w, strings.Join(cells, "\t"))
}

func (t *table) flush() error { return t.w.Flush() }
