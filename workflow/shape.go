package workflow

import (
	"crypto/sha256"
	"encoding"
	"encoding/hex"
	"encoding/json"
	"reflect"
	"strings"
)

// stateShape returns a hash of the JSON shape of type t: the field names
// encoding/json uses, and the shape of each value, recursively, numbers by
// their exact kind (an int64 reads -1, a uint32 does not; a float32 does
// not read 1e300) and a []byte as the base64 string encoding/json makes of
// it. Two state types with one shape read each other's JSON; a renamed
// field, a field whose type changed, or a field removed gives another
// shape. It is a definition's Spec.State.
func stateShape(t reflect.Type) string { return shapeHash(t, true) }

// earlierStateShape is the hash releases of onceflow before Spec.Earlier
// made of t: every integer kind "integer", every float "number", a []byte
// an array of integers. Kept so that a record stamped by one of them is
// known as its definition's (Spec.Earlier); do not change it.
func earlierStateShape(t reflect.Type) string { return shapeHash(t, false) }

func shapeHash(t reflect.Type, exact bool) string {
	s := shaper{seen: map[reflect.Type]bool{}, exact: exact}
	s.describe(t)
	sum := sha256.Sum256([]byte(s.b.String()))
	return hex.EncodeToString(sum[:8])
}

var (
	jsonMarshaler = reflect.TypeFor[json.Marshaler]()
	textMarshaler = reflect.TypeFor[encoding.TextMarshaler]()
)

// shaper writes a type's JSON shape to b; seen guards recursive types.
// exact names numbers by kind; without it, as earlierStateShape.
type shaper struct {
	b     strings.Builder
	seen  map[reflect.Type]bool
	exact bool
}

// marshalsItself reports a type with its own JSON or text encoding.
func marshalsItself(t reflect.Type) bool {
	return t.Implements(jsonMarshaler) || t.Implements(textMarshaler) ||
		reflect.PointerTo(t).Implements(jsonMarshaler) || reflect.PointerTo(t).Implements(textMarshaler)
}

func (s *shaper) describe(t reflect.Type) {
	if marshalsItself(t) {
		// Its own encoding: only its name says what it is.
		s.b.WriteString("custom " + t.PkgPath() + "." + t.Name())
		return
	}
	switch t.Kind() {
	case reflect.Pointer:
		s.describe(t.Elem())
	case reflect.Slice, reflect.Array:
		if s.exact && t.Kind() == reflect.Slice && t.Elem().Kind() == reflect.Uint8 && !marshalsItself(t.Elem()) {
			s.b.WriteString("bytes") // encoding/json's base64 string
			return
		}
		s.b.WriteString("[")
		s.describe(t.Elem())
		s.b.WriteString("]")
	case reflect.Map:
		s.b.WriteString("{" + t.Key().Kind().String() + ":")
		s.describe(t.Elem())
		s.b.WriteString("}")
	case reflect.Struct:
		if s.seen[t] {
			s.b.WriteString("recursive " + t.PkgPath() + "." + t.Name())
			return
		}
		s.seen[t] = true
		defer delete(s.seen, t)
		s.b.WriteString("{")
		s.fields(t)
		s.b.WriteString("}")
	case reflect.Interface:
		s.b.WriteString("any")
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr:
		s.number(t, "integer")
	case reflect.Float32, reflect.Float64:
		s.number(t, "number")
	default:
		s.b.WriteString(t.Kind().String())
	}
}

// number writes a number's kind, or earlier, what releases before
// Spec.Earlier wrote for every kind of its family.
func (s *shaper) number(t reflect.Type, earlier string) {
	if s.exact {
		s.b.WriteString(t.Kind().String())
		return
	}
	s.b.WriteString(earlier)
}

// fields writes the fields of struct t as encoding/json sees them:
// exported, by their JSON names, embedded structs' fields in place.
func (s *shaper) fields(t reflect.Type) {
	for f := range t.Fields() {
		tag := f.Tag.Get("json")
		if tag == "-" {
			continue
		}
		name, opts, _ := strings.Cut(tag, ",")
		ft := f.Type
		if f.Anonymous && name == "" {
			et := ft
			if et.Kind() == reflect.Pointer {
				et = et.Elem()
			}
			if et.Kind() == reflect.Struct {
				s.fields(et)
				continue
			}
		}
		if !f.IsExported() {
			continue
		}
		if name == "" {
			name = f.Name
		}
		s.b.WriteString(name + ":")
		switch {
		case strings.Contains(opts, "string") && s.exact:
			// A quoted value: a ",string" int64 still reads "-1" where a
			// uint32 does not.
			s.b.WriteString("string ")
			s.describe(ft)
		case strings.Contains(opts, "string"):
			s.b.WriteString("string")
		default:
			s.describe(ft)
		}
		s.b.WriteString(";")
	}
}
