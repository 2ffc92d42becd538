package idemhttp_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/foreign"
	"github.com/onceflow/onceflow/idemhttp"
	"github.com/onceflow/onceflow/internal/dbtest"
	"github.com/onceflow/onceflow/internal/faults"
	"github.com/onceflow/onceflow/phase"
	"github.com/onceflow/onceflow/recovery"
	"github.com/onceflow/onceflow/workflow"
)

// stormTenant owns every key of the storm.
const stormTenant = "storm"

// stormSeqHeader carries a request's number, so that the server finds its
// fault plan.
const stormSeqHeader = "X-Storm-Request"

// stormOrder is the storm's request; every request for one key sends the
// same one.
type stormOrder struct {
	Customer    string `json:"customer"`
	AmountCents int64  `json:"amount_cents"`
}

// stormState names the execution that produced each part of the answer, so
// that a second execution would answer different bytes: the row each
// atomic phase wrote, the request whose attempt wrote it, and the charge.
type stormState struct {
	Rows   map[string]int64 `json:"rows"`
	By     map[string]int   `json:"by"`
	Charge string           `json:"charge"`
}

// stormSteps are the storm workflow's atomic phases, in order; the foreign
// step charge comes after the first.
var stormSteps = []string{"reserve", "record", "confirm"}

// stormZombieAt is where the first attempt of every key to pass it
// becomes a zombie, whatever its plan: it has claimed the key and holds
// charge's result, not yet committed with record. Every attempt that
// commits record passes here first (a foreign result commits with the next
// phase), so every key has one. Its duplicate holds at stormZombieHold,
// record committed, while the zombie goes on to commit record too: only the
// owner fence refuses that second commit, so each key proves the fence
// once, on every seed, beside the zombies the plan draws at random.
var (
	stormZombieAt   = workflow.CrashPoint{Kind: workflow.AfterForeignCall, Step: "charge"}
	stormZombieHold = workflow.CrashPoint{Kind: workflow.AfterCommit, Step: stormSteps[1]}
)

// stormPlan is what the server does to one request's attempt. Zero points
// are never passed.
type stormPlan struct {
	crashAt workflow.CrashPoint // the attempt stops here, as a process death would
	abort   bool                // after the crash, drop the connection instead of answering
	// expireAt is where the key's lease is expired under the live attempt.
	// A duplicate request, planned by duplicate, is then sent; once it has
	// taken the key over and reached its holdAt (or ended), this attempt,
	// now a zombie, goes on, while the duplicate waits there for the
	// zombie's answer. Both run the same steps at once; the fence must let
	// only the owner's commits through.
	expireAt  workflow.CrashPoint
	duplicate *stormPlan
	holdAt    workflow.CrashPoint
}

// stormRequest is one request: its plan, and what the server saw.
type stormRequest struct {
	seq      int
	key      string
	plan     stormPlan
	crashed  atomic.Pointer[workflow.CrashPoint]
	arrivals atomic.Int32
	// zombie is set once the request's attempt is its key's certain
	// zombie (stormZombieAt): it no longer crashes as planned.
	zombie atomic.Bool
	// answered is closed once the request is answered.
	answered chan struct{}
	// For a duplicate: reached is closed at holdAt, where it waits for
	// release, its zombie's answered.
	reached, release chan struct{}
}

func newStormRequest(seq int, key string, plan stormPlan) *stormRequest {
	return &stormRequest{seq: seq, key: key, plan: plan, answered: make(chan struct{}), reached: make(chan struct{})}
}

type stormRequestKey struct{}

// stormAnswer is one request's history: when it ran and what it got.
type stormAnswer struct {
	seq        int
	start, end time.Time
	status     int // 0: no answer
	body       []byte
	replayed   bool
	retryAfter string
	err        string // the transport's error, when there was no answer
	crashedAt  string // the crash point its attempt stopped at; "" for none
}

func (a stormAnswer) String() string {
	s := fmt.Sprintf("request %d: ", a.seq)
	if a.status == 0 {
		s += "no answer (" + a.err + ")"
	} else {
		s += fmt.Sprintf("%d replayed=%v retry-after=%q %.120s", a.status, a.replayed, a.retryAfter, a.body)
	}
	if a.crashedAt != "" {
		s += ", crashed " + a.crashedAt
	}
	return s
}

// storm is a real HTTP server running a workflow through idemhttp, with
// faults injected into its attempts, and the effects it counted.
type storm struct {
	t      *testing.T
	db     *pgxpool.Pool
	engine *workflow.Engine
	wf     *workflow.Workflow[stormOrder, stormState]
	url    string
	client *http.Client

	orders   map[string]stormOrder // key -> the order every request for it sends
	requests sync.Map              // seq -> *stormRequest
	nextSeq  atomic.Int32          // the number of the next request not planned in advance
	expiries atomic.Int32
	zombies  atomic.Int32 // attempts whose lease was expired and whose key was sent again
	// certain holds the keys whose certain zombie (stormZombieAt) came.
	certain sync.Map
	// duplicates are the requests zombies' hooks sent.
	duplicates sync.WaitGroup

	// historyMu guards history: zombies' hooks record their duplicates'
	// answers from server goroutines, while the test reads it.
	historyMu sync.Mutex
	history   map[string][]stormAnswer // key -> answers

	mu      sync.Mutex
	calls   map[string]int                 // derived key -> calls
	charges map[string]string              // derived key -> charge id
	derived map[string]map[string]struct{} // client key -> derived keys called
}

func newStorm(t *testing.T) *storm {
	t.Helper()
	s := &storm{t: t, db: dbtest.NewPool(t, 24), orders: map[string]stormOrder{}, history: map[string][]stormAnswer{},
		calls: map[string]int{}, charges: map[string]string{}, derived: map[string]map[string]struct{}{}}
	// No UNIQUE constraint: a second execution of a phase must show.
	_, err := s.db.Exec(context.Background(),
		`CREATE TABLE storm_effects (id bigserial PRIMARY KEY, tenant text NOT NULL, key text NOT NULL, step text NOT NULL, request int NOT NULL)`)
	require.NoError(t, err)
	effect := func(name string) phase.Step[stormOrder, stormState] {
		return phase.Atomic(name, func(ctx context.Context, tx pgx.Tx, r *phase.Run[stormOrder, stormState]) error {
			by := stormRequestOf(ctx).seq
			var id int64
			if err := tx.QueryRow(ctx, `INSERT INTO storm_effects (tenant, key, step, request) VALUES ($1, $2, $3, $4) RETURNING id`,
				r.Key.Tenant, r.Key.ID, r.Step, by).Scan(&id); err != nil {
				return err
			}
			if r.State.Rows == nil {
				r.State.Rows, r.State.By = map[string]int64{}, map[string]int{}
			}
			r.State.Rows[r.Step], r.State.By[r.Step] = id, by
			return nil
		})
	}
	// A middle phase (record) makes a zombie's commit observable: the
	// last phase's is refused by the completed status even without the
	// owner fence.
	s.wf = workflow.Define("storm",
		effect(stormSteps[0]),
		foreign.Mutation("charge", func(_ context.Context, c *foreign.Call[stormOrder, stormState]) error {
			c.State.Charge = s.charge(c.Run.Key.ID, c.Key)
			return nil
		}),
		effect(stormSteps[1]),
		effect(stormSteps[2]),
	).Finish(func(st *stormState) workflow.Response { return workflow.JSON(http.StatusCreated, st) })
	s.engine, err = workflow.NewEngine(s.db, workflow.Config{
		MaxAttempts: -1, // crashes and expiries count as attempts; the storm must not fail keys terminally
		Hooks:       &workflow.Hooks{CrashPoint: s.crashPoint},
	})
	require.NoError(t, err)
	h, err := idemhttp.Workflow(s.engine, s.wf, idemhttp.WorkflowConfig{Tenant: trustedTenant})
	require.NoError(t, err)
	mux := http.NewServeMux()
	mux.Handle("POST /v1/storm", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		seq, _ := strconv.Atoi(r.Header.Get(stormSeqHeader))
		v, ok := s.requests.Load(seq)
		if !ok {
			http.Error(w, "unknown request", http.StatusTeapot)
			return
		}
		req := v.(*stormRequest)
		if req.arrivals.Add(1) > 1 {
			s.t.Errorf("request %d arrived twice", req.seq)
			return
		}
		defer close(req.answered) // also when the handler drops the connection
		h.ServeHTTP(&stormWriter{ResponseWriter: w, req: req}, r.WithContext(context.WithValue(r.Context(), stormRequestKey{}, req)))
	}))
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	s.url = srv.URL
	s.client = srv.Client()
	s.client.Timeout = time.Minute
	return s
}

func stormRequestOf(ctx context.Context) *stormRequest {
	req, _ := ctx.Value(stormRequestKey{}).(*stormRequest)
	if req == nil {
		return &stormRequest{seq: -1}
	}
	return req
}

// charge is the provider: it counts calls by derived key and charges once
// per derived key.
func (s *storm) charge(clientKey, derivedKey string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.calls[derivedKey]++
	if s.derived[clientKey] == nil {
		s.derived[clientKey] = map[string]struct{}{}
	}
	s.derived[clientKey][derivedKey] = struct{}{}
	if id, ok := s.charges[derivedKey]; ok {
		return id
	}
	id := fmt.Sprintf("ch_%d", len(s.charges)+1)
	s.charges[derivedKey] = id
	return id
}

// crashPoint carries out the plan of the request whose attempt passes p.
// Expiries are planned only where the attempt holds no transaction: one
// waiting for its locks would wait for ever.
func (s *storm) crashPoint(ctx context.Context, key workflow.Key, p workflow.CrashPoint) error {
	req := stormRequestOf(ctx)
	expireAt, duplicate := req.plan.expireAt, req.plan.duplicate
	if p == stormZombieAt {
		if _, seen := s.certain.LoadOrStore(key.ID, true); !seen {
			req.zombie.Store(true)
			expireAt, duplicate = p, &stormPlan{holdAt: stormZombieHold}
		}
	}
	if p == expireAt && s.expire(ctx, key) && duplicate != nil {
		s.zombies.Add(1)
		dup := newStormRequest(int(s.nextSeq.Add(1))-1, key.ID, *duplicate)
		dup.release = req.answered
		ended := make(chan struct{})
		s.duplicates.Go(func() {
			defer close(ended)
			s.record(key.ID, s.send(dup))
		})
		select {
		case <-dup.reached:
		case <-ended:
		}
	}
	if p == req.plan.holdAt {
		close(req.reached)
		<-req.release
	}
	if p == req.plan.crashAt && !req.zombie.Load() {
		req.crashed.Store(&p)
		return errors.New("the process died")
	}
	return nil
}

// expire ends key's lease now and reports whether it was in flight.
func (s *storm) expire(ctx context.Context, key workflow.Key) bool {
	err := s.engine.Store().ExpireLease(ctx, key)
	if err == nil {
		s.expiries.Add(1)
		return true
	}
	if !errors.Is(err, recovery.ErrNotFound) {
		s.t.Errorf("expire the lease of %s: %v", key.ID, err)
	}
	return false
}

// record adds an answer to its key's history.
func (s *storm) record(key string, a stormAnswer) {
	s.historyMu.Lock()
	defer s.historyMu.Unlock()
	s.history[key] = append(s.history[key], a)
}

// answers returns a copy of key's history. Read it only through here while
// a zombie's duplicate may still be running: a key's certain zombie can
// come in the final retries, and its duplicate records its answer from a
// server goroutine while the test goes on to the next retry.
func (s *storm) answers(key string) []stormAnswer {
	s.historyMu.Lock()
	defer s.historyMu.Unlock()
	return slices.Clone(s.history[key])
}

// stormWriter drops the connection instead of answering when the
// request's plan says so and its attempt crashed: the client sees no answer,
// as from a process that died.
type stormWriter struct {
	http.ResponseWriter
	req *stormRequest
}

func (w *stormWriter) WriteHeader(status int) {
	if w.req.plan.abort && w.req.crashed.Load() != nil {
		panic(http.ErrAbortHandler)
	}
	w.ResponseWriter.WriteHeader(status)
}

// send posts the order of req's key as request req and returns its
// history. It runs in server goroutines too: a failure is an answer's error.
func (s *storm) send(req *stormRequest) stormAnswer {
	s.requests.Store(req.seq, req)
	a := stormAnswer{seq: req.seq}
	body, err := json.Marshal(s.orders[req.key])
	if err != nil {
		a.err = err.Error()
		return a
	}
	r, err := http.NewRequest(http.MethodPost, s.url+"/v1/storm", bytes.NewReader(body))
	if err != nil {
		a.err = err.Error()
		return a
	}
	// net/http re-sends a request with an Idempotency-Key on a new
	// connection when a reused one drops it; without GetBody it cannot,
	// and each request arrives once, as its history says.
	r.GetBody = nil
	r.Header.Set("Content-Type", "application/json")
	r.Header.Set(idemhttp.Header, req.key)
	r.Header.Set("X-Tenant-ID", stormTenant)
	r.Header.Set(stormSeqHeader, strconv.Itoa(req.seq))
	a.start = time.Now()
	resp, err := s.client.Do(r)
	if err == nil {
		a.status = resp.StatusCode
		a.replayed = resp.Header.Get(idemhttp.ReplayedHeader) == "true"
		a.retryAfter = resp.Header.Get("Retry-After")
		a.body, err = io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			a.status = 0
		}
	}
	if err != nil {
		a.err = err.Error()
	}
	a.end = time.Now()
	if p := req.crashed.Load(); p != nil {
		a.crashedAt = p.String()
	}
	return a
}

// stormStored is a key's record as onceflow_keys holds it at the end.
type stormStored struct {
	status string
	code   int
	body   []byte
}

// stormHistory is everything one key went through.
type stormHistory struct {
	key     string
	stored  stormStored
	answers []stormAnswer
	// The workflow's first and last steps: a request may crash before the
	// first one's claim even when the key is finished, and an attempt that
	// crashed after the last one's commit completed the key without
	// answering.
	first, last string
}

// check applies the storm's invariant to one key's history and returns
// what broke it:
//
//   - the key completed with a 201;
//   - a request whose attempt did not crash got either the stored response
//     (status and body byte for byte) or 409 with a Retry-After of at least
//     a second; nothing else (no 5xx, no 422, no dropped connection);
//   - a request whose attempt crashed got a 5xx or no answer, never a 2xx
//     or a 409;
//   - exactly one attempt completed the key: the fresh (not replayed)
//     answers, plus the attempts that crashed right after the completion's
//     commit, number one;
//   - once a 201 was answered, a request that starts later gets the stored
//     response, unless it crashed before its claim.
func (h stormHistory) check() []string {
	var broken []string
	fail := func(format string, args ...any) { broken = append(broken, fmt.Sprintf(format, args...)) }
	if h.stored.status != string(recovery.StatusCompleted) || h.stored.code != http.StatusCreated {
		fail("the key ended %s with %d, not completed with 201", h.stored.status, h.stored.code)
	}
	var (
		completions int
		answered    time.Time // when the first 201 was answered
	)
	completedAt := workflow.CrashPoint{Kind: workflow.AfterCommit, Step: h.last}.String()
	beforeClaim := workflow.CrashPoint{Kind: workflow.BeforeStep, Step: h.first}.String()
	for _, a := range h.answers {
		switch {
		case a.crashedAt != "":
			if a.status != 0 && a.status < 500 {
				fail("%v: a crashed attempt answered below 500", a)
			}
			if a.crashedAt == completedAt {
				completions++
			}
		case a.status == h.stored.code:
			if !bytes.Equal(a.body, h.stored.body) {
				fail("%v: not the stored response %s", a, h.stored.body)
			}
			if !a.replayed {
				completions++
			}
			if answered.IsZero() || a.end.Before(answered) {
				answered = a.end
			}
		case a.status == http.StatusConflict:
			if n, err := strconv.Atoi(a.retryAfter); err != nil || n < 1 {
				fail("%v: a 409 without a Retry-After of at least a second", a)
			}
		default:
			fail("%v: neither the stored response nor a 409, and the attempt did not crash", a)
		}
	}
	if completions != 1 {
		fail("%d attempts completed the key (fresh answers and crashes after the completion's commit); want 1", completions)
	}
	for _, a := range h.answers {
		late := !answered.IsZero() && a.start.After(answered)
		if late && a.crashedAt != beforeClaim && (a.status != h.stored.code || !a.replayed) {
			fail("%v: started after a 201 was answered, yet did not get the replay", a)
		}
	}
	return broken
}

// TestDuplicateStorm: concurrent requests over a few keys, through a real
// HTTP server, with attempts crashing at random points (some dropping the
// connection) and leases expiring under live attempts; every key has at
// least one zombie that tries to commit a phase its duplicate committed
// (stormZombieAt), which only the owner fence stops. Each key's history
// passes the invariant checker (stormHistory.check): one execution per
// key, and every answer the stored response, a 409, or the answer of a
// crashed attempt. Each step's effect happened once per key: one row per
// atomic phase, one charge per key under its derived key; and the stored
// response names exactly those rows and that charge.
func TestDuplicateStorm(t *testing.T) {
	t.Parallel()
	rng := faults.Rand(t)
	requests, keys := faults.Size(200, 2000), faults.Size(10, 40)
	s := newStorm(t)
	points := workflow.CrashPoints(s.wf)
	var expirable []workflow.CrashPoint // not with a transaction open: its locks would block the expiry
	for _, p := range points {
		if p.Kind != workflow.BeforeCommit {
			expirable = append(expirable, p)
		}
	}
	keyOf := func(k int) string { return fmt.Sprintf("key-%02d", k) }
	for k := range keys {
		s.orders[keyOf(k)] = stormOrder{Customer: fmt.Sprintf("c-%02d", k), AmountCents: int64(100 + rng.IntN(10000))}
	}
	crash := func(plan *stormPlan) {
		if rng.Float64() < 0.3 {
			plan.crashAt = points[rng.IntN(len(points))]
			plan.abort = rng.Float64() < 0.3
		}
	}
	// Where a duplicate waits for its zombie: past the zombie's point, so
	// that the two run the same steps.
	holdAfter := func(p workflow.CrashPoint) workflow.CrashPoint {
		i := slices.Index(expirable, p)
		return expirable[i+rng.IntN(len(expirable)-i)]
	}

	// The plan is drawn in one goroutine, so a seed replays it. A request
	// starts at once or when an earlier one has ended, so that arrivals
	// spread over the storm without sleeps: later requests meet keys in
	// flight, crashed, taken over and finished.
	reqs := make([]*stormRequest, requests)
	expireFirst := make([]bool, requests) // the client expires the key's lease just before sending
	after := make([]int, requests)        // the request this one waits for; -1: none
	ended := make([]chan struct{}, requests)
	for i, k := range rng.Perm(requests) {
		after[i], ended[i] = -1, make(chan struct{})
		if i > 0 && rng.Float64() < 0.8 {
			after[i] = rng.IntN(i)
		}
		req := newStormRequest(i, keyOf(k%keys), stormPlan{})
		crash(&req.plan)
		if rng.Float64() < 0.3 {
			req.plan.expireAt = expirable[rng.IntN(len(expirable))]
			req.plan.duplicate = &stormPlan{holdAt: holdAfter(req.plan.expireAt)}
			crash(req.plan.duplicate)
		}
		expireFirst[i] = rng.Float64() < 0.1
		reqs[i] = req
	}
	s.nextSeq.Store(int32(requests))

	var (
		wg    sync.WaitGroup
		start = make(chan struct{})
	)
	for i, req := range reqs {
		wg.Go(func() {
			defer close(ended[i])
			<-start
			if after[i] >= 0 {
				<-ended[after[i]]
			}
			if expireFirst[i] {
				s.expire(context.Background(), workflow.Key{Tenant: stormTenant, ID: req.key})
			}
			s.record(req.key, s.send(req))
		})
	}
	close(start)
	wg.Wait()
	s.duplicates.Wait()
	stormed := int(s.nextSeq.Load())

	// Every key is finished by retrying it: a key left by a crashed attempt
	// is held by its lease, which is expired rather than waited out.
	for k := range keys {
		key := keyOf(k)
		for try := 0; ; try++ {
			require.Less(t, try, 5, "key %s did not complete; history:\n%s", key, stormLines(s.answers(key)))
			a := s.send(newStormRequest(int(s.nextSeq.Add(1))-1, key, stormPlan{}))
			s.record(key, a)
			if a.status == http.StatusCreated {
				break
			}
			require.Equal(t, http.StatusConflict, a.status, "%v", a)
			s.expire(context.Background(), workflow.Key{Tenant: stormTenant, ID: key})
		}
	}
	s.duplicates.Wait() // a key's certain zombie may have come in its final retries

	stored := s.stored()
	require.Len(t, stored, keys)
	for k := range keys {
		key := keyOf(k)
		h := stormHistory{key: key, stored: stored[key], answers: s.history[key], first: stormSteps[0], last: stormSteps[len(stormSteps)-1]}
		if broken := h.check(); len(broken) > 0 {
			t.Errorf("key %s broke the invariant:\n  %s\nhistory:\n%s", key, strings.Join(broken, "\n  "), stormLines(h.answers))
		}
		s.requireOnce(key, stored[key].body)
		_, zombie := s.certain.Load(key)
		require.True(t, zombie, "key %s had no zombie at %v", key, stormZombieAt)
	}
	s.logCounts(int(s.nextSeq.Load()) - stormed)
}

// stored reads every key's stored outcome from onceflow_keys.
func (s *storm) stored() map[string]stormStored {
	s.t.Helper()
	rows, err := s.db.Query(context.Background(),
		`SELECT key, status, coalesce(response_status, 0), coalesce(response_body, '') FROM onceflow_keys WHERE tenant_id = $1`, stormTenant)
	require.NoError(s.t, err)
	stored := map[string]stormStored{}
	for rows.Next() {
		var (
			key string
			st  stormStored
		)
		require.NoError(s.t, rows.Scan(&key, &st.status, &st.code, &st.body))
		stored[key] = st
	}
	require.NoError(s.t, rows.Err())
	return stored
}

// requireOnce checks the effects of key: one row per atomic phase (the
// table has no UNIQUE constraint to hide a second), one derived key charged
// (the record's), and a stored response that names exactly those rows and
// that charge.
func (s *storm) requireOnce(key string, body []byte) {
	s.t.Helper()
	ctx := context.Background()
	rows := map[string][]int64{}
	r, err := s.db.Query(ctx, `SELECT step, id FROM storm_effects WHERE tenant = $1 AND key = $2 ORDER BY id`, stormTenant, key)
	require.NoError(s.t, err)
	for r.Next() {
		var (
			step string
			id   int64
		)
		require.NoError(s.t, r.Scan(&step, &id))
		rows[step] = append(rows[step], id)
	}
	require.NoError(s.t, r.Err())
	once := map[string]int64{}
	for _, step := range stormSteps {
		require.Len(s.t, rows[step], 1, "key %s: %s took effect more or less than once: %v", key, step, rows)
		once[step] = rows[step][0]
	}

	rec, err := s.engine.Store().Load(ctx, workflow.Key{Tenant: stormTenant, ID: key})
	require.NoError(s.t, err)
	derived := foreign.DeriveKey(rec.Key, rec.ID, "charge")
	s.mu.Lock()
	called := s.derived[key]
	charge := s.charges[derived]
	s.mu.Unlock()
	require.Equal(s.t, map[string]struct{}{derived: {}}, called, "key %s: charged under one derived key, the record's", key)

	var st stormState
	require.NoError(s.t, json.Unmarshal(body, &st))
	require.Equal(s.t, once, st.Rows, "key %s: the response names the rows that stand", key)
	require.Equal(s.t, charge, st.Charge, "key %s: the response names the charge made", key)
}

// logCounts logs what the storm did.
func (s *storm) logCounts(retries int) {
	var fresh, replays, conflicts, crashed, dropped, requests int
	for _, answers := range s.history {
		requests += len(answers)
		for _, a := range answers {
			switch {
			case a.crashedAt != "" && a.status == 0:
				dropped++
			case a.crashedAt != "":
				crashed++
			case a.status == http.StatusConflict:
				conflicts++
			case a.replayed:
				replays++
			default:
				fresh++
			}
		}
	}
	s.mu.Lock()
	var calls int
	for _, n := range s.calls {
		calls += n
	}
	charges := len(s.charges)
	s.mu.Unlock()
	s.t.Logf("%d keys, %d requests (%d sent by zombies' hooks, %d final retries): %d fresh 201, %d replays, %d 409, "+
		"%d crashed with a 5xx, %d crashed without an answer; %d leases expired; %d charge calls, %d charges",
		len(s.history), requests, s.zombies.Load(), retries, fresh, replays, conflicts,
		crashed, dropped, s.expiries.Load(), calls, charges)
}

func stormLines(answers []stormAnswer) string {
	sorted := slices.Clone(answers)
	slices.SortFunc(sorted, func(a, b stormAnswer) int { return a.start.Compare(b.start) })
	var b strings.Builder
	for _, a := range sorted {
		fmt.Fprintf(&b, "  %v\n", a)
	}
	return b.String()
}

// TestStormCheckerCatchesWrongAnswers: the storm's invariant checker
// rejects each kind of wrong history it is there to catch, and accepts a
// right one.
func TestStormCheckerCatchesWrongAnswers(t *testing.T) {
	t.Parallel()
	stored := stormStored{status: "completed", code: 201, body: []byte(`{"reserved":1}`)}
	at := func(s int) time.Time { return time.Unix(1_000_000, 0).Add(time.Duration(s) * time.Second) }
	ok := func(seq, start, end int, replayed bool) stormAnswer {
		return stormAnswer{seq: seq, start: at(start), end: at(end), status: 201, body: stored.body, replayed: replayed}
	}
	conflict := stormAnswer{seq: 9, start: at(0), end: at(1), status: 409, retryAfter: "30"}
	crashed := stormAnswer{seq: 8, start: at(0), end: at(1), status: 503, retryAfter: "1", crashedAt: "after charge's call"}
	right := []stormAnswer{ok(1, 0, 2, false), ok(2, 1, 3, true), conflict, crashed, ok(3, 4, 5, true)}

	cases := map[string]struct {
		answers []stormAnswer
		stored  stormStored
	}{
		"a second, different 201": {answers: append(slices.Clone(right),
			stormAnswer{seq: 4, start: at(0), end: at(2), status: 201, body: []byte(`{"reserved":2}`)})},
		"a second fresh 201 with the same bytes": {answers: append(slices.Clone(right), ok(4, 0, 2, false))},
		"no attempt completed the key":           {answers: []stormAnswer{ok(2, 1, 3, true)}},
		"a 409 without Retry-After": {answers: append(slices.Clone(right),
			stormAnswer{seq: 4, start: at(0), end: at(1), status: 409})},
		"a 5xx from an attempt that did not crash": {answers: append(slices.Clone(right),
			stormAnswer{seq: 4, start: at(0), end: at(1), status: 500})},
		"no answer to an attempt that did not crash": {answers: append(slices.Clone(right),
			stormAnswer{seq: 4, start: at(0), end: at(1), err: "EOF"})},
		"a 201 to an attempt that crashed": {answers: append(slices.Clone(right),
			stormAnswer{seq: 4, start: at(0), end: at(1), status: 201, body: stored.body, crashedAt: "before charge"})},
		"a 422": {answers: append(slices.Clone(right),
			stormAnswer{seq: 4, start: at(0), end: at(1), status: 422})},
		"a 409 after the key answered 201": {answers: append(slices.Clone(right),
			stormAnswer{seq: 4, start: at(6), end: at(7), status: 409, retryAfter: "1"})},
		"a fresh 201 after the key answered 201": {answers: []stormAnswer{ok(1, 0, 2, false),
			{seq: 2, start: at(3), end: at(4), status: 201, body: stored.body}}},
		"the key was never completed": {answers: right, stored: stormStored{status: "in_flight"}},
	}
	for name, tc := range cases {
		st := cmpStored(tc.stored, stored)
		h := stormHistory{key: "k", stored: st, answers: tc.answers, first: "reserve", last: "confirm"}
		require.NotEmpty(t, h.check(), "the checker let through %s", name)
	}
	good := stormHistory{key: "k", stored: stored, answers: right, first: "reserve", last: "confirm"}
	require.Empty(t, good.check())
	lostAck := stormHistory{key: "k", stored: stored, first: "reserve", last: "confirm", answers: []stormAnswer{
		{seq: 1, start: at(0), end: at(1), status: 503, crashedAt: "after confirm's commit"},
		{seq: 2, start: at(2), end: at(3), err: "EOF", crashedAt: "before reserve"},
		ok(3, 2, 3, true),
	}}
	require.Empty(t, lostAck.check(), "a completion whose answer was lost, and a crash before the claim")
}

func cmpStored(s, def stormStored) stormStored {
	if s.status == "" {
		return def
	}
	return s
}
