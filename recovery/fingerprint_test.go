package recovery_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/recovery"
)

func TestFingerprint(t *testing.T) {
	t.Parallel()
	a, canonA, err := recovery.FingerprintJSON("checkout", []byte(`{"amount": 100, "items": [{"sku":"x","qty":1}]}`))
	require.NoError(t, err)
	b, _, err := recovery.FingerprintJSON("checkout", []byte("{\n  \"items\": [{\"qty\": 1.0, \"sku\": \"\\u0078\"}],\n  \"amount\": 1e2\n}"))
	require.NoError(t, err)
	require.Equal(t, a, b, "an honest retry from another JSON encoder has the same fingerprint")
	require.JSONEq(t, `{"amount":100,"items":[{"qty":1,"sku":"x"}]}`, string(canonA))

	other, _, err := recovery.FingerprintJSON("refund", []byte(`{"amount":100,"items":[{"sku":"x","qty":1}]}`))
	require.NoError(t, err)
	require.NotEqual(t, a, other, "the operation is part of the fingerprint")

	changed, _, err := recovery.FingerprintJSON("checkout", []byte(`{"amount":101,"items":[{"sku":"x","qty":1}]}`))
	require.NoError(t, err)
	require.NotEqual(t, a, changed)

	require.NotEqual(t, a, recovery.FingerprintBytes("checkout", canonA), "JSON and raw fingerprints never collide")
	require.Equal(t, recovery.FingerprintBytes("op", []byte("x")), recovery.FingerprintBytes("op", []byte("x")))
	require.NotEqual(t, recovery.FingerprintBytes("op", []byte("x")), recovery.FingerprintBytes("op", []byte("y")))
	require.Len(t, a.String(), 64)

	_, _, err = recovery.FingerprintJSON("checkout", []byte(`{"a":`))
	require.ErrorIs(t, err, recovery.ErrInvalidJSON)
}

func TestFingerprintOperationCannotPoseAsBody(t *testing.T) {
	t.Parallel()
	require.NotEqual(t,
		recovery.FingerprintBytes("op", []byte("x\x00y")),
		recovery.FingerprintBytes("op\x00x", []byte("y")))
}
