package migrations

// Load exposes load to the tests.
var Load = load

// Bodies returns m's SQL, up and down, as the files hold it.
func Bodies(m Migration) (up, down string) { return m.up, m.down }
