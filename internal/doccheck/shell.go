package doccheck

import (
	"errors"
	"fmt"
	"strings"
)

// Words splits a command line as a POSIX shell would for the subset
// documentation uses: words separated by blanks, 'single quotes' taken
// literally, "double quotes" and bare words with $NAME and ${NAME}
// expanded by env. Anything else a shell would treat specially (a pipe, a
// redirection, a backslash, a command substitution, a comment) is an
// error, so that a line a test runs is the line a reader pastes.
func Words(line string, env func(string) string) ([]string, error) {
	var (
		words  []string
		word   strings.Builder
		inWord bool
	)
	for i := 0; i < len(line); {
		c := line[i]
		switch {
		case c == ' ' || c == '\t':
			if inWord {
				words = append(words, word.String())
				word.Reset()
				inWord = false
			}
			i++
		case c == '\'':
			end := strings.IndexByte(line[i+1:], '\'')
			if end < 0 {
				return nil, errors.New("unterminated single quote")
			}
			word.WriteString(line[i+1 : i+1+end])
			inWord = true
			i += end + 2
		case c == '"':
			end := strings.IndexByte(line[i+1:], '"')
			if end < 0 {
				return nil, errors.New("unterminated double quote")
			}
			quoted := line[i+1 : i+1+end]
			if strings.ContainsAny(quoted, "\\`") {
				return nil, fmt.Errorf("%q: escapes and command substitution are not supported", quoted)
			}
			word.WriteString(expand(quoted, env))
			inWord = true
			i += end + 2
		case strings.IndexByte("|&;<>()`\\#*?[", c) >= 0:
			return nil, fmt.Errorf("%q at byte %d: shell syntax beyond words and quotes", c, i)
		default:
			end := i
			for end < len(line) && strings.IndexByte(" \t'\"|&;<>()`\\#*?[", line[end]) < 0 {
				end++
			}
			word.WriteString(expand(line[i:end], env))
			inWord = true
			i = end
		}
	}
	if inWord {
		words = append(words, word.String())
	}
	return words, nil
}

// expand replaces $NAME and ${NAME} in s with env(NAME).
func expand(s string, env func(string) string) string {
	var out strings.Builder
	for {
		i := strings.IndexByte(s, '$')
		if i < 0 {
			out.WriteString(s)
			return out.String()
		}
		out.WriteString(s[:i])
		s = s[i+1:]
		braced := strings.HasPrefix(s, "{")
		if braced {
			s = s[1:]
		}
		n := 0
		for n < len(s) && (s[n] == '_' || 'A' <= s[n] && s[n] <= 'Z' || 'a' <= s[n] && s[n] <= 'z' || n > 0 && '0' <= s[n] && s[n] <= '9') {
			n++
		}
		out.WriteString(env(s[:n]))
		s = s[n:]
		if braced {
			s = strings.TrimPrefix(s, "}")
		}
	}
}
