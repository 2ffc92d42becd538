package idemhttp

// WithPolled returns cfg whose waiting requests (Prefer: wait) call polled
// after each claim that found their key in flight, holding no connection.
func WithPolled(cfg Config, polled func()) Config {
	cfg.polled = polled
	return cfg
}

// WorkflowWithPolled is WithPolled for a WorkflowConfig.
func WorkflowWithPolled(cfg WorkflowConfig, polled func()) WorkflowConfig {
	cfg.polled = polled
	return cfg
}

// PreferredWait is preferredWait, for its table test.
var PreferredWait = preferredWait
