package bench

import (
	"context"
)

func scaleCase(ctx context.Context, srv *server, cfg Config) ([]Result, error) { return nil, nil }
