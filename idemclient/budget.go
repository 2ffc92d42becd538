package idemclient

import "sync"

// budget is the retry budget: a token bucket shared by a Client's intents.
type budget struct {
	ratio, burst float64

	mu     sync.Mutex
	tokens float64
}

func newBudget(cfg BudgetConfig) *budget {
	return &budget{ratio: cfg.Ratio, burst: cfg.Burst, tokens: cfg.Burst}
}

// deposit adds an intent's share, up to the bucket's size.
func (b *budget) deposit() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.tokens = min(b.burst, b.tokens+b.ratio)
}

// take takes a token for a retry, reporting whether there was one.
func (b *budget) take() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.tokens < 1 {
		return false
	}
	b.tokens--
	return true
}

// refund puts back the token of a retry that was not sent after all.
func (b *budget) refund() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.tokens = min(b.burst, b.tokens+1)
}
