package routing

import (
	"regexp"
	"strings"
)

// dollarTag opens a dollar-quoted string: $$ or $tag$ ($1 is a parameter).
var dollarTag = regexp.MustCompile(`^\$(?:[A-Za-z_][A-Za-z0-9_]*)?\$`)

// normalize returns sql in lower case without comments, with every string
// literal (quoted or dollar-quoted) as an empty literal and the quotes around
// identifiers removed, so that "public".onceflow_keys reads as
// public.onceflow_keys.
func normalize(sql string) string {
	var b strings.Builder
	for i := 0; i < len(sql); {
		rest := sql[i:]
		switch {
		case strings.HasPrefix(rest, "--"):
			i += lineEnd(rest)
		case strings.HasPrefix(rest, "/*"):
			i += blockEnd(rest)
			b.WriteByte(' ')
		case rest[0] == '\'':
			i += quoteEnd(rest, '\'')
			b.WriteString("''")
		case rest[0] == '"':
			n := quoteEnd(rest, '"')
			b.WriteString(strings.ReplaceAll(rest[1:n-1], `""`, `"`))
			i += n
		case rest[0] == '$' && dollarTag.MatchString(rest):
			i += dollarEnd(rest)
			b.WriteString("''")
		default:
			b.WriteByte(rest[0])
			i++
		}
	}
	return strings.ToLower(b.String())
}

// statements splits sql at the semicolons that end its statements (not
// those in comments or literals), leaving out empty ones.
func statements(sql string) []string {
	var out []string
	start := 0
	flush := func(end int) {
		if strings.TrimSpace(normalize(sql[start:end])) != "" {
			out = append(out, sql[start:end])
		}
		start = end + 1
	}
	for i := 0; i < len(sql); {
		rest := sql[i:]
		switch {
		case strings.HasPrefix(rest, "--"):
			i += lineEnd(rest)
		case strings.HasPrefix(rest, "/*"):
			i += blockEnd(rest)
		case rest[0] == '\'' || rest[0] == '"':
			i += quoteEnd(rest, rest[0])
		case rest[0] == '$' && dollarTag.MatchString(rest):
			i += dollarEnd(rest)
		case rest[0] == ';':
			flush(i)
			i++
		default:
			i++
		}
	}
	flush(len(sql))
	return out
}

// dollarEnd returns the length of the dollar-quoted string s opens.
func dollarEnd(s string) int {
	tag := dollarTag.FindString(s)
	if n := strings.Index(s[len(tag):], tag); n >= 0 {
		return 2*len(tag) + n
	}
	return len(s)
}

// lineEnd returns the length of the comment s opens, up to its newline.
func lineEnd(s string) int {
	if n := strings.IndexByte(s, '\n'); n >= 0 {
		return n
	}
	return len(s)
}

// blockEnd returns the length of the /* comment */ s opens (comments nest).
func blockEnd(s string) int {
	depth := 0
	for i := 0; i+1 < len(s); i++ {
		switch s[i : i+2] {
		case "/*":
			depth++
			i++
		case "*/":
			depth--
			i++
			if depth == 0 {
				return i + 1
			}
		}
	}
	return len(s)
}

// quoteEnd returns the length of the literal s opens with q, a doubled q
// inside it included.
func quoteEnd(s string, q byte) int {
	for i := 1; i < len(s); i++ {
		if s[i] == q {
			if i+1 < len(s) && s[i+1] == q {
				i++
				continue
			}
			return i + 1
		}
	}
	return len(s)
}
