package migrations

// Load exposes load to the tests.
var Load = load
