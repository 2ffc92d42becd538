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
// encoding/json uses, and the shape of each value, recursively. Two state
// types with one shape read each other's JSON; a renamed field, a field
// whose type changed, or a field removed gives another shape. It is a
// definition's Spec.State.
func stateShape(t reflect.Type) string {
	var b strings.Builder
	describeShape(&b, t, map[reflect.Type]bool{})
	sum := sha256.Sum256([]byte(b.String()))
	return hex.EncodeToString(sum[:8])
}

var (
	jsonMarshaler = reflect.TypeFor[json.Marshaler]()
	textMarshaler = reflect.TypeFor[encoding.TextMarshaler]()
)

// describeShape writes t's JSON shape to b; seen guards recursive types.
func describeShape(b *strings.Builder, t reflect.Type, seen map[reflect.Type]bool) {
	if t.Implements(jsonMarshaler) || t.Implements(textMarshaler) ||
		reflect.PointerTo(t).Implements(jsonMarshaler) || reflect.PointerTo(t).Implements(textMarshaler) {
		// Its own encoding: only its name says what it is.
		b.WriteString("custom " + t.PkgPath() + "." + t.Name())
		return
	}
	switch t.Kind() {
	case reflect.Pointer:
		describeShape(b, t.Elem(), seen)
	case reflect.Slice, reflect.Array:
		b.WriteString("[")
		describeShape(b, t.Elem(), seen)
		b.WriteString("]")
	case reflect.Map:
		b.WriteString("{" + t.Key().Kind().String() + ":")
		describeShape(b, t.Elem(), seen)
		b.WriteString("}")
	case reflect.Struct:
		if seen[t] {
			b.WriteString("recursive " + t.PkgPath() + "." + t.Name())
			return
		}
		seen[t] = true
		defer delete(seen, t)
		b.WriteString("{")
		describeFields(b, t, seen)
		b.WriteString("}")
	case reflect.Interface:
		b.WriteString("any")
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr:
		b.WriteString("integer")
	case reflect.Float32, reflect.Float64:
		b.WriteString("number")
	default:
		b.WriteString(t.Kind().String())
	}
}

// describeFields writes the fields of struct t as encoding/json sees them:
// exported, by their JSON names, embedded structs' fields in place.
func describeFields(b *strings.Builder, t reflect.Type, seen map[reflect.Type]bool) {
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
				describeFields(b, et, seen)
				continue
			}
		}
		if !f.IsExported() {
			continue
		}
		if name == "" {
			name = f.Name
		}
		b.WriteString(name + ":")
		if strings.Contains(opts, "string") {
			b.WriteString("string")
		} else {
			describeShape(b, ft, seen)
		}
		b.WriteString(";")
	}
}
