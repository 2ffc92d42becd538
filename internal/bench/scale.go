package bench

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/onceflow/onceflow/workflow"
)

// scaleWorkers is each scale worker's concurrency, and scaleProcesses the
// numbers of worker processes the scale case compares.
const scaleWorkers = 8

var scaleProcesses = []int{1, 2, 4}

// WorkerConfig configures one scale worker process.
type WorkerConfig struct {
	// DatabaseURL is the database to run the realistic checkout on, its
	// tables made.
	DatabaseURL string
	// NetworkDelay is the one-way delay of the worker's own proxy to the
	// database; 0 connects directly.
	NetworkDelay time.Duration
	// Concurrency is the number of workflows the worker runs at once.
	Concurrency int
	// ID makes the worker's keys unique among the workers.
	ID string
}

// workerResult is what a worker answers to a command.
type workerResult struct {
	Ops     int64   `json:"ops"`
	GaveUp  int64   `json:"gave_up"`
	Seconds float64 `json:"seconds"`
	Error   string  `json:"error,omitempty"`
}

// RunWorker is one application process of the scale case. It connects,
// writes "ready", then reads commands from in, one a line: "onceflow D"
// or "floor D" runs that side of the realistic checkout for duration D and
// writes the operations it did as a JSON line to out. It returns when in
// ends.
func RunWorker(ctx context.Context, cfg WorkerConfig, in io.Reader, out io.Writer) error {
	conn, err := (&database{url: cfg.DatabaseURL}).overNetwork(ctx, cfg.NetworkDelay, int32(cfg.Concurrency)+2)
	if err != nil {
		return err
	}
	defer conn.close()
	engine, err := workflow.NewEngine(conn.pool, workflow.Config{})
	if err != nil {
		return err
	}
	var gaveUp atomic.Int64
	sides := map[string]op{
		"onceflow": contention(realisticOnceflow(engine, realisticWorkflow(), cfg.ID+"-o"), &gaveUp),
		"floor":    realisticFloor(conn.pool, cfg.ID+"-f", nil),
	}
	if _, err := fmt.Fprintln(out, "ready"); err != nil {
		return err
	}
	var next atomic.Int64
	lines := bufio.NewScanner(in)
	for lines.Scan() {
		name, arg, _ := strings.Cut(lines.Text(), " ")
		d, err := time.ParseDuration(arg)
		fn, ok := sides[name]
		if err != nil || !ok {
			return fmt.Errorf("scale worker: bad command %q", lines.Text())
		}
		gaveUpBefore := gaveUp.Load()
		n, took, err := runFor(ctx, d, cfg.Concurrency, fn, &next)
		res := workerResult{Ops: n, GaveUp: gaveUp.Load() - gaveUpBefore, Seconds: took.Seconds()}
		if err != nil {
			res.Error = err.Error()
		}
		if err := json.NewEncoder(out).Encode(res); err != nil {
			return err
		}
	}
	return lines.Err()
}

// worker is a running worker process, as the scale case sees it.
type worker struct {
	cmd    *exec.Cmd
	in     io.WriteCloser
	out    *bufio.Scanner
	stderr bytes.Buffer
}

// startWorker starts a worker process and waits for its "ready".
func startWorker(ctx context.Context, cfg Config, url, id string) (*worker, error) {
	args := slices.Concat(cfg.Worker[1:], []string{"--network-delay", cfg.NetworkDelay.String(),
		"--concurrency", fmt.Sprint(scaleWorkers), "--id", id})
	w := &worker{cmd: exec.CommandContext(ctx, cfg.Worker[0], args...)}
	// The URL holds a password: the environment, not the command line.
	w.cmd.Env = append(os.Environ(), WorkerURLEnv+"="+url)
	w.cmd.Stderr = &w.stderr
	in, err := w.cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	out, err := w.cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	w.in, w.out = in, bufio.NewScanner(out)
	if err := w.cmd.Start(); err != nil {
		return nil, fmt.Errorf("start scale worker: %w", err)
	}
	if !w.out.Scan() || w.out.Text() != "ready" {
		return nil, w.fail()
	}
	return w, nil
}

// WorkerURLEnv is the environment variable a scale worker takes its
// database's URL from.
const WorkerURLEnv = "ONCEFLOW_BENCH_WORKER_URL"

func (w *worker) fail() error {
	w.stop()
	return fmt.Errorf("scale worker failed: %s", strings.TrimSpace(w.stderr.String()))
}

func (w *worker) stop() {
	_ = w.in.Close()
	_ = w.cmd.Wait()
}

// result reads the answer to the last command.
func (w *worker) result() (workerResult, error) {
	var res workerResult
	if !w.out.Scan() {
		return res, w.fail()
	}
	if err := json.Unmarshal(w.out.Bytes(), &res); err != nil {
		return res, err
	}
	if res.Error != "" {
		return res, fmt.Errorf("scale worker: %s", res.Error)
	}
	return res, nil
}

// scaleCase runs the realistic checkout from 1, 2 and 4 worker processes
// on one database, each side in alternation, and reports the throughput
// with the server's CPU use.
func scaleCase(ctx context.Context, srv *server, cfg Config) ([]Result, error) {
	db, err := srv.newDatabase(ctx, 2)
	if err != nil {
		return nil, err
	}
	defer db.close()
	if _, err := db.pool.Exec(ctx, shopSchema); err != nil {
		return nil, err
	}
	var results []Result
	for _, procs := range scaleProcesses {
		r, err := scaleRun(ctx, srv, cfg, db.url, procs)
		if err != nil {
			return nil, err
		}
		results = append(results, r)
	}
	return results, nil
}

// scaleRun measures procs worker processes.
func scaleRun(ctx context.Context, srv *server, cfg Config, url string, procs int) (Result, error) {
	workers := make([]*worker, 0, procs)
	defer func() {
		for _, w := range workers {
			w.stop()
		}
	}()
	for i := range procs {
		w, err := startWorker(ctx, cfg, url, fmt.Sprintf("p%d-%d", procs, i))
		if err != nil {
			return Result{}, err
		}
		workers = append(workers, w)
	}
	type total struct {
		ops     int64
		gaveUp  int64
		seconds float64
		cpu     time.Duration // the server's
		wall    time.Duration
	}
	sums := map[string]*total{"onceflow": {}, "floor": {}}
	for range cfg.Rounds {
		for _, side := range []string{"onceflow", "floor"} {
			cpuBefore, cpuErr := srv.serverCPU()
			started := time.Now()
			for _, w := range workers {
				if _, err := fmt.Fprintf(w.in, "%s %s\n", side, cfg.Round); err != nil {
					return Result{}, w.fail()
				}
			}
			var seconds float64
			for _, w := range workers {
				res, err := w.result()
				if err != nil {
					return Result{}, err
				}
				sums[side].ops += res.Ops
				sums[side].gaveUp += res.GaveUp
				seconds = max(seconds, res.Seconds)
			}
			sums[side].wall += time.Since(started)
			sums[side].seconds += seconds
			if cpuAfter, err := srv.serverCPU(); err == nil && cpuErr == nil {
				sums[side].cpu += cpuAfter - cpuBefore
			}
		}
	}
	rate := func(t *total) float64 { return float64(t.ops) / t.seconds }
	cores := func(t *total) float64 { return t.cpu.Seconds() / t.wall.Seconds() }
	once, floor := sums["onceflow"], sums["floor"]
	r := ratio(fmt.Sprintf("scale: realistic checkout, %d process(es) × %d workers", procs, scaleWorkers),
		rate(once), rate(floor), "/s", 0)
	r.Target, r.Pass = "reported", true
	r.Note = fmt.Sprintf("server CPU %.2f cores (onceflow), %.2f (floor)", cores(once), cores(floor))
	if _, err := srv.serverCPU(); err != nil {
		r.Note = "server CPU unknown: " + err.Error()
	}
	if once.gaveUp > 0 {
		r.Note += fmt.Sprintf("; %d claims gave up on a row lock (lock_timeout), not counted", once.gaveUp)
	}
	return r, nil
}
