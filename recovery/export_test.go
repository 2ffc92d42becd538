package recovery

import "reflect"

// StatementsOf returns the statements s runs, by their field name in
// queries, for tests that look at their plans.
func StatementsOf(s *Store) map[string]string {
	v := reflect.ValueOf(s.sql).Elem()
	out := make(map[string]string, v.NumField())
	for i := range v.NumField() {
		out[v.Type().Field(i).Name] = v.Field(i).String()
	}
	return out
}
