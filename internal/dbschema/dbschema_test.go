package dbschema_test

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/internal/dbschema"
)

func TestResolve(t *testing.T) {
	t.Parallel()
	for _, name := range []string{"public", "idem", "Billing_EU", "_x", "a1", strings.Repeat("s", 63)} {
		got, err := dbschema.Resolve(name)
		require.NoError(t, err, "%q", name)
		require.Equal(t, name, got)
	}
	got, err := dbschema.Resolve("")
	require.NoError(t, err)
	require.Equal(t, dbschema.Default, got)

	for _, name := range []string{
		`x$$; CREATE TABLE pwned (); $$`, // breaks out of a $$-quoted function body
		`a"b`, `Billing "EU"`, "a b", "a-b", "a.b", "1abc", "$1", "é", "a\x00b", "a\nb",
		strings.Repeat("s", 64),
	} {
		_, err := dbschema.Resolve(name)
		require.ErrorIs(t, err, dbschema.ErrInvalid, "%q", name)
	}
}

func TestExpandQuotesTheName(t *testing.T) {
	t.Parallel()
	require.Equal(t, `SELECT * FROM "Billing_EU".onceflow_keys`, dbschema.Expand(`SELECT * FROM {schema}.onceflow_keys`, "Billing_EU"))
}
