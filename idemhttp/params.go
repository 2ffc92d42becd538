package idemhttp

import (
	"errors"
	"fmt"
	"strings"
)

// parseParams checks that rest is RFC 8941 parameters and nothing else:
// *( ";" *SP key [ "=" bare-item ] ) (section 3.1.2). The parameters are
// not used; they are parsed so that what follows them is found.
func parseParams(rest string) error {
	for rest != "" {
		if rest[0] != ';' {
			return fmt.Errorf("unexpected %q: the header holds one item (a list of several is refused)", rest[:1])
		}
		rest = strings.TrimLeft(rest[1:], " ")
		n := paramKeyLength(rest)
		if n == 0 {
			return errors.New("a parameter has no valid name")
		}
		rest = rest[n:]
		if strings.HasPrefix(rest, "=") {
			var err error
			if rest, err = skipBareItem(rest[1:]); err != nil {
				return err
			}
		}
	}
	return nil
}

// paramKeyLength is the length of the parameter name at the start of s:
// ( lcalpha / "*" ) *( lcalpha / DIGIT / "_" / "-" / "." / "*" ).
func paramKeyLength(s string) int {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c >= 'a' && c <= 'z' || c == '*' || i > 0 && (c >= '0' && c <= '9' || strings.IndexByte("_-.", c) >= 0) {
			continue
		}
		return i
	}
	return len(s)
}

// skipBareItem returns what follows the bare item at the start of s: an
// integer or decimal, a string, a token, a byte sequence or a boolean.
func skipBareItem(s string) (string, error) {
	bad := errors.New("a parameter's value is not an RFC 8941 bare item")
	switch {
	case s == "":
		return "", bad
	case s[0] == '-' || isDigit(s[0]):
		return skipNumber(s)
	case s[0] == '"':
		_, rest, err := parseString(s)
		return rest, err
	case s[0] == '*' || isAlpha(s[0]):
		i := 1
		for i < len(s) && (isTchar(s[i]) || s[i] == ':' || s[i] == '/') {
			i++
		}
		return s[i:], nil
	case s[0] == ':':
		i := 1
		for i < len(s) && (isAlpha(s[i]) || isDigit(s[i]) || strings.IndexByte("+/=", s[i]) >= 0) {
			i++
		}
		if i == len(s) || s[i] != ':' {
			return "", bad
		}
		return s[i+1:], nil
	case s[0] == '?' && len(s) > 1 && (s[1] == '0' || s[1] == '1'):
		return s[2:], nil
	}
	return "", bad
}

// skipNumber skips an sf-integer (up to 15 digits) or sf-decimal (up to 12
// digits, a point, 1 to 3 digits), with an optional minus sign.
func skipNumber(s string) (string, error) {
	bad := errors.New("a parameter's number is not an RFC 8941 integer or decimal")
	i := 0
	if s[0] == '-' {
		i++
	}
	start := i
	for i < len(s) && isDigit(s[i]) {
		i++
	}
	digits := i - start
	if digits == 0 || digits > 15 {
		return "", bad
	}
	if i < len(s) && s[i] == '.' {
		i++
		fraction := i
		for i < len(s) && isDigit(s[i]) {
			i++
		}
		if digits > 12 || i-fraction == 0 || i-fraction > 3 {
			return "", bad
		}
	}
	return s[i:], nil
}

func isDigit(c byte) bool { return c >= '0' && c <= '9' }
func isAlpha(c byte) bool { return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' }

// isTchar reports a token character (RFC 9110, section 5.6.2).
func isTchar(c byte) bool {
	return isAlpha(c) || isDigit(c) || strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0
}
