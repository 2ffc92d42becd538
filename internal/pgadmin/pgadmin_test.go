package pgadmin

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestDatabaseURL(t *testing.T) {
	t.Parallel()
	require.Equal(t, "postgres://u:p@h:5/other?sslmode=disable", DatabaseURL("postgres://u:p@h:5/postgres?sslmode=disable", "other"))
	require.Equal(t, "host=h user=u dbname=other", DatabaseURL("host=h user=u", "other"))
	require.Equal(t, "postgres://u:xxxxx@h/db", Redact("postgres://u:secret@h/db"))
	require.Equal(t, "postgres:///db?host=/run", Redact("postgres:///db?host=/run"))
	require.Equal(t, "the database server", Redact("host=h password=secret"))
}
