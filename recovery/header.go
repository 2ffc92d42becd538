package recovery

import (
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"unicode/utf8"
)

// A stored response's header (the response_header column, jsonb) maps each
// name to its values, in order. A value is a JSON string when jsonb holds
// it exactly: valid UTF-8 without NUL. Any other value, such as a
// Latin-1 filename in Content-Disposition, which a JSON string would
// carry as U+FFFD, is an object holding its bytes in standard base64:
//
//	{"Content-Disposition": [{"base64": "YXR0YWNobWVudDsgZmlsZW5hbWU9ImNhZukucGRmIg=="}]}
//
// A record stored before this encoding holds strings only, and reads as it
// was stored.

// headerValue is one header value as stored.
type headerValue string

// encodedValue is the stored form of a value a JSON string cannot hold.
type encodedValue struct {
	Base64 *[]byte `json:"base64"` // encoding/json writes []byte in standard base64
}

// MarshalJSON writes v as a JSON string if jsonb keeps it byte for byte,
// else as an encodedValue.
func (v headerValue) MarshalJSON() ([]byte, error) {
	if s := string(v); utf8.ValidString(s) && !strings.ContainsRune(s, 0) {
		return json.Marshal(s)
	}
	raw := []byte(v)
	return json.Marshal(encodedValue{Base64: &raw})
}

// UnmarshalJSON reads either form MarshalJSON writes.
func (v *headerValue) UnmarshalJSON(data []byte) error {
	if len(data) > 0 && data[0] == '"' {
		var s string
		err := json.Unmarshal(data, &s)
		*v = headerValue(s)
		return err
	}
	var enc encodedValue
	if err := json.Unmarshal(data, &enc); err != nil {
		return err
	}
	if enc.Base64 == nil {
		return errors.New(`a header value is neither a string nor {"base64": …}`)
	}
	*v = headerValue(*enc.Base64)
	return nil
}

// encodeHeader returns h as the response_header column stores it.
func encodeHeader(h http.Header) ([]byte, error) {
	stored := make(map[string][]headerValue, len(h))
	for name, values := range h {
		if values == nil {
			stored[name] = nil
			continue
		}
		stored[name] = make([]headerValue, len(values))
		for i, value := range values {
			stored[name][i] = headerValue(value)
		}
	}
	return json.Marshal(stored)
}

// decodeHeader reads the response_header column.
func decodeHeader(data []byte) (http.Header, error) {
	var stored map[string][]headerValue
	if err := json.Unmarshal(data, &stored); err != nil {
		return nil, err
	}
	h := make(http.Header, len(stored))
	for name, values := range stored {
		if values == nil {
			h[name] = nil
			continue
		}
		h[name] = make([]string, len(values))
		for i, value := range values {
			h[name][i] = string(value)
		}
	}
	return h, nil
}
