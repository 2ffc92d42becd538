package idemhttp

import (
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
)

// Conditional requests (RFC 9110 §13) make a write naturally idempotent:
// a PATCH sent with If-Match: "v7" applies to version 7 only, so its retry,
// or a concurrent client's, is refused with 412 instead of overwriting what
// it did not see. Such a route needs no Idempotency-Key.

var (
	// ErrPreconditionFailed reports an If-Match or If-None-Match that is
	// false for the current resource: 412.
	ErrPreconditionFailed = errors.New("precondition failed: the resource is not in the state the request names")
	// ErrPreconditionRequired reports a request that must be conditional
	// and is not: 428.
	ErrPreconditionRequired = errors.New("precondition required: send If-Match with the ETag of the resource")
	// ErrNotModified reports a GET or HEAD whose If-None-Match matches the
	// current resource: 304.
	ErrNotModified = errors.New("not modified")
	// ErrBadPrecondition reports an If-Match or If-None-Match that is not
	// "*" or a list of entity tags: 400.
	ErrBadPrecondition = errors.New("malformed precondition")
)

// ETag returns the strong entity tag of version: "v7", quotes included.
// VersionFromETag reads it back.
func ETag(version int64) string { return `"v` + strconv.FormatInt(version, 10) + `"` }

// VersionFromETag returns the version of an entity tag ETag made; false for
// any other tag, a weak one included.
func VersionFromETag(tag string) (int64, bool) {
	digits, ok := strings.CutPrefix(tag, `"v`)
	digits, ok2 := strings.CutSuffix(digits, `"`)
	version, err := strconv.ParseInt(digits, 10, 64)
	if !ok || !ok2 || err != nil || ETag(version) != tag {
		return 0, false
	}
	return version, true
}

// CheckPreconditions evaluates the request's If-Match and If-None-Match
// against current, the entity tag of the resource as it is ("" when it does
// not exist), in the order of RFC 9110 §13.2.2:
//
//   - If-Match is true when it is "*" and the resource exists, or when one
//     of its entity tags equals current by the strong comparison (a weak
//     tag never does); false is ErrPreconditionFailed.
//   - If-None-Match is false when it is "*" and the resource exists, or
//     when one of its entity tags equals current by the weak comparison;
//     false is ErrNotModified for GET and HEAD, ErrPreconditionFailed for
//     other methods.
//
// A header that is not "*" or a comma-separated list of entity tags
// (repeated headers form one list) is ErrBadPrecondition. With required, a
// request with neither header is ErrPreconditionRequired. Date
// preconditions (If-Unmodified-Since, If-Modified-Since) are not evaluated.
// The result is nil when the request may proceed. Call it after
// authentication and after finding the resource, and make the write
// conditional on the same tag ([VersionedUpdate]): the resource may change
// between this check and the write.
func CheckPreconditions(r *http.Request, current string, required bool) error {
	ifMatch, ifNoneMatch := r.Header.Values("If-Match"), r.Header.Values("If-None-Match")
	if required && ifMatch == nil && ifNoneMatch == nil {
		return ErrPreconditionRequired
	}
	if ifMatch != nil {
		tags, star, err := parseTags("If-Match", ifMatch)
		switch {
		case err != nil:
			return err
		case current == "" || !star && !containsTag(tags, current, strongMatch):
			return ErrPreconditionFailed
		}
	}
	if ifNoneMatch != nil {
		tags, star, err := parseTags("If-None-Match", ifNoneMatch)
		switch {
		case err != nil:
			return err
		case current == "" || !star && !containsTag(tags, current, weakMatch):
			return nil
		case r.Method == http.MethodGet || r.Method == http.MethodHead:
			return ErrNotModified
		default:
			return ErrPreconditionFailed
		}
	}
	return nil
}

// WritePrecondition answers err when it is one of this file's errors (or
// wraps one, as [ErrVersionMismatch] does) and reports whether it did: 412,
// 428 and 400 as RFC 9457 problem details, 304 with no body. Set ETag (and
// any Cache-Control) on w first: a 304 must carry them.
func WritePrecondition(w http.ResponseWriter, err error) bool {
	var p *problem
	switch {
	case errors.Is(err, ErrNotModified):
		w.WriteHeader(http.StatusNotModified)
		return true
	case errors.Is(err, ErrPreconditionFailed):
		p = &problem{status: http.StatusPreconditionFailed,
			detail: "the resource has changed since the ETag the request names; GET it again and retry with its ETag"}
	case errors.Is(err, ErrPreconditionRequired):
		p = &problem{status: http.StatusPreconditionRequired,
			detail: "this request must be conditional: send If-Match with the ETag of a GET of the resource"}
	case errors.Is(err, ErrBadPrecondition):
		p = &problem{status: http.StatusBadRequest, detail: err.Error()}
	default:
		return false
	}
	writeProblem(w, p)
	return true
}

// entityTag is one member of an If-Match or If-None-Match list.
type entityTag struct {
	weak   bool
	opaque string // quotes included
}

// parseTags parses the values of header: "*" alone (star), or a list of
// entity tags, with empty members allowed between commas (RFC 9110 §5.6.1).
// Repeated headers are one list.
func parseTags(header string, values []string) (tags []entityTag, star bool, err error) {
	list := strings.Join(values, ",")
	if strings.Trim(list, " \t") == "*" {
		return nil, true, nil
	}
	for rest := list; ; {
		rest = strings.TrimLeft(rest, " \t,")
		if rest == "" {
			break
		}
		tag, after, ok := scanTag(rest)
		after = strings.TrimLeft(after, " \t")
		if !ok || after != "" && after[0] != ',' {
			return nil, false, fmt.Errorf("%w: %s is neither * nor a list of entity tags such as \"v7\"", ErrBadPrecondition, header)
		}
		tags, rest = append(tags, tag), after
	}
	if len(tags) == 0 {
		return nil, false, fmt.Errorf("%w: %s is empty", ErrBadPrecondition, header)
	}
	return tags, false, nil
}

// scanTag reads the entity tag s starts with, W/"x" or "x", and returns it
// and what follows it. The characters between the quotes are RFC 9110's
// etagc: any visible byte but the double quote, and obs-text.
func scanTag(s string) (tag entityTag, rest string, ok bool) {
	opaque, weak := strings.CutPrefix(s, "W/")
	if opaque == "" || opaque[0] != '"' {
		return entityTag{}, "", false
	}
	for i := 1; i < len(opaque); i++ {
		switch c := opaque[i]; {
		case c == '"':
			return entityTag{weak: weak, opaque: opaque[:i+1]}, opaque[i+1:], true
		case c < 0x21 || c == 0x7f:
			return entityTag{}, "", false
		}
	}
	return entityTag{}, "", false
}

// parseTag parses current, one whole entity tag.
func parseTag(current string) (entityTag, bool) {
	tag, rest, ok := scanTag(current)
	return tag, ok && rest == ""
}

// containsTag reports whether one of tags equals the entity tag current by
// match.
func containsTag(tags []entityTag, current string, match func(a, b entityTag) bool) bool {
	cur, ok := parseTag(current)
	if !ok {
		return false
	}
	for _, tag := range tags {
		if match(tag, cur) {
			return true
		}
	}
	return false
}

// strongMatch is RFC 9110's strong comparison: neither weak, same opaque
// tag.
func strongMatch(a, b entityTag) bool { return !a.weak && !b.weak && a.opaque == b.opaque }

// weakMatch is RFC 9110's weak comparison: the same opaque tag.
func weakMatch(a, b entityTag) bool { return a.opaque == b.opaque }
