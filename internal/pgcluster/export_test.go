package pgcluster

// SetVersionedRoot points the /usr/lib/postgresql search elsewhere.
func SetVersionedRoot(dir string) (restore func()) {
	old := versionedRoot
	versionedRoot = dir
	return func() { versionedRoot = old }
}
