package sweeper

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"runtime/debug"
	"sync"
	"time"

	"github.com/robfig/cron/v3"
)

// Task is work a sweeper runs on a schedule.
type Task interface {
	// Name identifies the task in logs and metrics.
	Name() string
	// Run does one round of work. It must return soon after ctx ends.
	Run(ctx context.Context) error
}

// Scheduled is a task and when to run it.
type Scheduled struct {
	// Schedule is a standard cron spec ("*/5 * * * *") or a descriptor
	// ("@every 10s", "@hourly").
	Schedule string
	Task     Task
}

// JitterDefault is the most a scheduled run waits, at random, before it
// starts, so that sweepers on many machines with one schedule spread out.
const JitterDefault = time.Second

// Config configures a Sweeper.
type Config struct {
	Tasks []Scheduled

	// Jitter is the most a scheduled run waits, at random, before starting.
	// 0 means JitterDefault; -1 means none.
	Jitter time.Duration

	// Logger receives task failures and start and stop lines. nil discards
	// them.
	Logger *slog.Logger

	// Observer, if set, is told of every task run.
	Observer Observer
}

// withDefaults returns cfg with each zero field set to its default.
func (cfg Config) withDefaults() Config {
	cfg.Jitter = cmp.Or(cfg.Jitter, JitterDefault)
	cfg.Logger = cmp.Or(cfg.Logger, slog.New(slog.DiscardHandler))
	return cfg
}

// validate reports a missing task or a schedule that does not parse.
func (cfg Config) validate() error {
	if len(cfg.Tasks) == 0 {
		return errors.New("sweeper: no tasks")
	}
	for _, t := range cfg.Tasks {
		if t.Task == nil {
			return errors.New("sweeper: a scheduled task is nil")
		}
		if _, err := parser.Parse(t.Schedule); err != nil {
			return fmt.Errorf("sweeper: schedule %q of %s: %w", t.Schedule, t.Task.Name(), err)
		}
	}
	return nil
}

// Observer is told what a sweeper's tasks do, for metrics. Its methods must
// be quick and safe for concurrent use.
type Observer interface {
	// TaskRan reports one run of a task, its duration and its error.
	TaskRan(task string, took time.Duration, err error)
	// Pruned reports rows a Pruner deleted from table.
	Pruned(table string, rows int)
	// Resumed reports a record the Completer resumed, and how it ended.
	Resumed(workflow string, err error)
	// Abandoned reports how many expired records of a workflow no
	// registered definition can resume (0 when none are left).
	Abandoned(workflow string, records int)
	// ParkedRecords reports how many records of a workflow are parked,
	// waiting for an operator (0 when none are left).
	ParkedRecords(workflow string, records int)
	// OldestInFlight reports the age of the oldest record in flight, 0
	// when none is.
	OldestInFlight(age time.Duration)
	// OldestStuck reports the age of a workflow's oldest stuck record: in
	// flight and held by no attempt (its lease ran out or was handed
	// back), counted from its creation; 0 when the workflow has none left.
	OldestStuck(workflow string, age time.Duration)
}

// Sweeper runs tasks on their schedules.
type Sweeper struct {
	cron     *cron.Cron
	logger   *slog.Logger
	observer Observer
	tasks    []Scheduled
	jitter   time.Duration

	mu       sync.Mutex
	started  bool
	cancel   context.CancelFunc
	stopOnce sync.Once
	stopped  chan struct{} // closed when Stop has finished
}

var parser = cron.NewParser(cron.Minute | cron.Hour | cron.Dom | cron.Month | cron.Dow | cron.Descriptor)

// New checks the schedules and returns a sweeper ready to Start.
func New(cfg Config) (*Sweeper, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	return &Sweeper{
		cron:     cron.New(cron.WithParser(parser), cron.WithChain(cron.SkipIfStillRunning(cronLogger{cfg.Logger}))),
		logger:   cfg.Logger,
		observer: cfg.Observer,
		tasks:    cfg.Tasks,
		jitter:   max(cfg.Jitter, 0),
		stopped:  make(chan struct{}),
	}, nil
}

// Start schedules the tasks and returns. Their runs get a context that ends
// at Stop or when ctx ends.
func (s *Sweeper) Start(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.started {
		return errors.New("sweeper: already started")
	}
	runCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	stop := context.AfterFunc(ctx, cancel)
	s.cancel = func() { stop(); cancel() }
	for _, t := range s.tasks {
		if _, err := s.cron.AddFunc(t.Schedule, func() { s.scheduled(runCtx, t.Task) }); err != nil {
			cancel()
			return err
		}
	}
	s.started = true
	s.cron.Start()
	s.logger.Info("sweeper started", slog.Int("tasks", len(s.tasks)))
	return nil
}

// Stop cancels running tasks, waits for them to return, and stops the
// schedule. It is safe to call more than once, at once, and before Start;
// every call returns once the sweeper has stopped.
func (s *Sweeper) Stop() {
	s.mu.Lock()
	started := s.started
	s.mu.Unlock()
	if !started {
		return
	}
	s.stopOnce.Do(func() {
		s.cancel()
		<-s.cron.Stop().Done()
		s.logger.Info("sweeper stopped")
		close(s.stopped)
	})
	<-s.stopped
}

// RunNow runs every task once, one after another, outside the schedule (at
// start-up, or from a command line), and returns their errors joined. Do
// not call it while the schedule runs: it does not skip a task that is
// already running.
func (s *Sweeper) RunNow(ctx context.Context) error {
	var errs []error
	for _, t := range s.tasks {
		if err := s.run(ctx, t.Task); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", t.Task.Name(), err))
		}
	}
	return errors.Join(errs...)
}

// scheduled is a run the schedule started: it waits a random jitter first.
func (s *Sweeper) scheduled(ctx context.Context, t Task) {
	if s.jitter > 0 {
		timer := time.NewTimer(rand.N(s.jitter))
		defer timer.Stop()
		select {
		case <-timer.C:
		case <-ctx.Done():
			return
		}
	}
	_ = s.run(ctx, t)
}

// run runs t once, turning a panic into an error, and reports it.
func (s *Sweeper) run(ctx context.Context, t Task) (err error) {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	started := time.Now()
	defer func() {
		if v := recover(); v != nil {
			err = fmt.Errorf("task panicked: %v", v)
			s.logger.Error("sweeper task panicked", slog.String("task", t.Name()), slog.Any("panic", v),
				slog.String("stack", string(debug.Stack())))
		}
		if s.observer != nil {
			s.observer.TaskRan(t.Name(), time.Since(started), err)
		}
		if err != nil && ctx.Err() == nil {
			s.logger.Warn("sweeper task failed", slog.String("task", t.Name()), slog.Any("error", err))
		}
	}()
	return t.Run(ctx)
}

// cronLogger sends cron's own messages to slog.
type cronLogger struct{ logger *slog.Logger }

func (l cronLogger) Info(msg string, kv ...any) { l.logger.Debug("cron: "+msg, kv...) }

func (l cronLogger) Error(err error, msg string, kv ...any) {
	l.logger.Error("cron: "+msg, append(kv, slog.Any("error", err))...)
}
