package idemhttp

import (
	"bytes"
	"encoding"
	"encoding/json"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strings"
)

// exactNames checks that every object member of the JSON document doc
// names a field of t exactly. encoding/json matches names without regard
// to case, so that "Amount_Cents" fills amount_cents, and of two members
// differing only in case the last wins: a request is read as its sender
// meant only when each name is the field's own. doc has been decoded into
// a t already, so its shape is t's; a type that decodes itself, an
// interface or a map key is not looked into.
func exactNames(doc []byte, t reflect.Type) error {
	dec := json.NewDecoder(bytes.NewReader(doc))
	dec.UseNumber() // every number decodes, whatever its size
	var v any
	if err := dec.Decode(&v); err != nil {
		return err
	}
	return checkNames(v, t, "")
}

var (
	jsonUnmarshaler = reflect.TypeFor[json.Unmarshaler]()
	textUnmarshaler = reflect.TypeFor[encoding.TextUnmarshaler]()
)

func checkNames(v any, t reflect.Type, path string) error {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if reflect.PointerTo(t).Implements(jsonUnmarshaler) || reflect.PointerTo(t).Implements(textUnmarshaler) {
		return nil
	}
	switch t.Kind() {
	case reflect.Struct:
		obj, ok := v.(map[string]any)
		if !ok {
			return nil
		}
		fields := fieldTypes(t)
		for _, name := range slices.Sorted(maps.Keys(obj)) { // the same answer every time
			member := obj[name]
			ft, ok := fields[name]
			if !ok {
				return fmt.Errorf("json: unknown field %q%s: field names match exactly, case included", name, where(path))
			}
			if err := checkNames(member, ft, path+"."+name); err != nil {
				return err
			}
		}
	case reflect.Map:
		obj, _ := v.(map[string]any)
		for name, member := range obj {
			if err := checkNames(member, t.Elem(), path+"."+name); err != nil {
				return err
			}
		}
	case reflect.Slice, reflect.Array:
		arr, _ := v.([]any)
		for i, item := range arr {
			if err := checkNames(item, t.Elem(), fmt.Sprintf("%s[%d]", path, i)); err != nil {
				return err
			}
		}
	}
	return nil
}

func where(path string) string {
	if path == "" {
		return ""
	}
	return " in " + strings.TrimPrefix(path, ".")
}

// fieldTypes returns the JSON names of t's fields, as encoding/json names
// them (a tag's name, else the field's; fields of embedded structs without
// a tag promoted unless the outer struct has the name), with their types.
func fieldTypes(t reflect.Type) map[string]reflect.Type {
	fields := map[string]reflect.Type{}
	var promoted []map[string]reflect.Type
	for i := range t.NumField() {
		f := t.Field(i)
		tag := f.Tag.Get("json")
		if tag == "-" {
			continue
		}
		name, _, _ := strings.Cut(tag, ",")
		ft := f.Type
		for ft.Kind() == reflect.Pointer {
			ft = ft.Elem()
		}
		if f.Anonymous && name == "" && ft.Kind() == reflect.Struct {
			promoted = append(promoted, fieldTypes(ft))
			continue
		}
		if !f.IsExported() {
			continue
		}
		if name == "" {
			name = f.Name
		}
		fields[name] = f.Type
	}
	for _, inner := range promoted {
		for name, ft := range inner {
			if _, ok := fields[name]; !ok {
				fields[name] = ft
			}
		}
	}
	return fields
}
