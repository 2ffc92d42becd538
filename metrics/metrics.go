// Package metrics exposes what onceflow does as Prometheus metrics.
//
// A *Metrics is an observer for the workflow engine (workflow.Config
// Observer), the outbox relay (outbox.RelayConfig Observer) and the sweeper
// (sweeper.Config, PrunerConfig and CompleterConfig Observer). Its
// collectors live in a registry of their own: serve Handler on an address of
// your choosing, or register them with yours (Collectors).
//
//	m := metrics.New()
//	engine, _ := workflow.NewEngine(pool, workflow.Config{Observer: m})
//	http.Handle("/metrics", m.Handler())
package metrics

import (
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/onceflow/onceflow/outbox"
	"github.com/onceflow/onceflow/sweeper"
	"github.com/onceflow/onceflow/workflow"
)

// Metrics holds onceflow's collectors.
type Metrics struct {
	registry    *prometheus.Registry
	claims      *prometheus.CounterVec
	leaseLost   *prometheus.CounterVec
	parked      *prometheus.CounterVec
	steps       *prometheus.HistogramVec
	retries     *prometheus.CounterVec
	deferrals   *prometheus.CounterVec
	undone      *prometheus.CounterVec
	paceWaits   *prometheus.HistogramVec
	paceDefers  *prometheus.CounterVec
	circuits    *prometheus.CounterVec
	resumes     *prometheus.CounterVec
	pruned      *prometheus.CounterVec
	outbox      *prometheus.CounterVec
	abandoned   *prometheus.GaugeVec
	parkedNow   *prometheus.GaugeVec
	oldest      prometheus.Gauge
	stuck       *prometheus.GaugeVec
	taskRuns    *prometheus.CounterVec
	taskSeconds *prometheus.HistogramVec
}

// New returns metrics registered in a registry of their own, together with
// the Go runtime and process collectors.
func New() *Metrics {
	m := &Metrics{
		registry: prometheus.NewRegistry(),
		claims: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "onceflow_claims_total",
			Help: "Requests carrying an idempotency key, by how they found it: new, replay, conflict, mismatch, forbidden, parked or takeover.",
		}, []string{"workflow", "outcome"}),
		leaseLost: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "onceflow_lease_lost_total",
			Help: "Attempts that found their key taken over and stopped.",
		}, []string{"workflow"}),
		parked: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "onceflow_parked_total",
			Help: "Records parked because the running definition may not resume them; each waits for an operator.",
		}, []string{"workflow"}),
		steps: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "onceflow_step_duration_seconds",
			Help:    "How long workflow steps ran, by result (ok or error).",
			Buckets: prometheus.ExponentialBuckets(0.001, 4, 10),
		}, []string{"workflow", "step", "result"}),
		retries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "onceflow_step_retries_total",
			Help: "Calls that steps retried within an attempt (foreign.Retry), one per retry.",
		}, []string{"workflow", "step"}),
		deferrals: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "onceflow_step_deferrals_total",
			Help: "Attempts that handed their key back until a time the other system asked for (Retry-After).",
		}, []string{"workflow", "step"}),
		undone: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "onceflow_compensations_total",
			Help: "Compensation calls, by result: ok (the step's effect is undone) or error.",
		}, []string{"workflow", "step", "result"}),
		paceWaits: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "onceflow_pace_wait_seconds",
			Help:    "How long paced calls (foreign.Limit) waited for their turn, by downstream; calls that did not wait are not observed.",
			Buckets: prometheus.ExponentialBuckets(0.001, 4, 10),
		}, []string{"downstream"}),
		paceDefers: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "onceflow_pace_deferrals_total",
			Help: "Paced calls whose turn was too far off, so that their key was deferred instead, by downstream.",
		}, []string{"downstream"}),
		circuits: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "onceflow_pace_circuit_opened_total",
			Help: "Answers (429 with Retry-After) that held back every call to a downstream, by downstream.",
		}, []string{"downstream"}),
		resumes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "onceflow_resumes_total",
			Help: "Abandoned records the completer resumed, by result (ok or error).",
		}, []string{"workflow", "result"}),
		pruned: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "onceflow_pruned_rows_total",
			Help: "Rows the pruner deleted.",
		}, []string{"table"}),
		outbox: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "onceflow_outbox_messages_total",
			Help: "Outbox deliveries by outcome: delivered, retried or dead.",
		}, []string{"topic", "outcome"}),
		abandoned: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "onceflow_abandoned_records",
			Help: "Expired records in flight of workflows the sweeper cannot resume.",
		}, []string{"workflow"}),
		parkedNow: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "onceflow_parked_records",
			Help: "Parked records, which wait for an operator (onceflow keys list --status parked).",
		}, []string{"workflow"}),
		oldest: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "onceflow_oldest_in_flight_seconds",
			Help: "Age of the oldest record in flight; 0 when none is.",
		}),
		stuck: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "onceflow_oldest_stuck_seconds",
			Help: "Age of the oldest stuck record of each workflow: in flight, held by no attempt (its lease ran out or was handed back), counted from its creation; 0 when none is.",
		}, []string{"workflow"}),
		taskRuns: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "onceflow_sweeper_task_runs_total",
			Help: "Sweeper task runs by result (ok or error).",
		}, []string{"task", "result"}),
		taskSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "onceflow_sweeper_task_duration_seconds",
			Help:    "How long sweeper task runs took.",
			Buckets: prometheus.ExponentialBuckets(0.001, 4, 10),
		}, []string{"task"}),
	}
	m.registry.MustRegister(m.Collectors()...)
	m.registry.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// Collectors returns onceflow's collectors, to register with a registry of
// your own.
func (m *Metrics) Collectors() []prometheus.Collector {
	return []prometheus.Collector{m.claims, m.leaseLost, m.parked, m.steps, m.retries, m.deferrals, m.undone, m.paceWaits, m.paceDefers, m.circuits, m.resumes, m.pruned, m.outbox, m.abandoned,
		m.parkedNow, m.oldest, m.stuck, m.taskRuns, m.taskSeconds}
}

// Registry returns the registry New created.
func (m *Metrics) Registry() *prometheus.Registry { return m.registry }

// Handler serves the registry in the Prometheus text format.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.registry, promhttp.HandlerOpts{Registry: m.registry})
}

func result(err error) string {
	if err != nil {
		return "error"
	}
	return "ok"
}

// Claimed counts a claim (workflow.Observer).
func (m *Metrics) Claimed(workflow, outcome string) {
	m.claims.WithLabelValues(workflow, outcome).Inc()
}

// StepFinished times a step (workflow.Observer).
func (m *Metrics) StepFinished(workflow, step string, took time.Duration, err error) {
	m.steps.WithLabelValues(workflow, step, result(err)).Observe(took.Seconds())
}

// StepRetried counts a retry within a step (workflow.Observer).
func (m *Metrics) StepRetried(workflow, step string) { m.retries.WithLabelValues(workflow, step).Inc() }

// StepDeferred counts a deferral (workflow.Observer).
func (m *Metrics) StepDeferred(workflow, step string) {
	m.deferrals.WithLabelValues(workflow, step).Inc()
}

// Compensated counts a compensation call (workflow.Observer).
func (m *Metrics) Compensated(workflow, step string, err error) {
	m.undone.WithLabelValues(workflow, step, result(err)).Inc()
}

// PaceWaited times a paced call's wait for its turn (workflow.Observer).
func (m *Metrics) PaceWaited(downstream string, waited time.Duration) {
	m.paceWaits.WithLabelValues(downstream).Observe(waited.Seconds())
}

// PaceDeferred counts a paced call that deferred its key (workflow.Observer).
func (m *Metrics) PaceDeferred(downstream string) { m.paceDefers.WithLabelValues(downstream).Inc() }

// CircuitOpened counts an opened circuit (workflow.Observer).
func (m *Metrics) CircuitOpened(downstream string, _ time.Duration) {
	m.circuits.WithLabelValues(downstream).Inc()
}

// LeaseLost counts a lost lease (workflow.Observer).
func (m *Metrics) LeaseLost(workflow string) { m.leaseLost.WithLabelValues(workflow).Inc() }

// Parked counts a parked record (workflow.Observer).
func (m *Metrics) Parked(workflow string) { m.parked.WithLabelValues(workflow).Inc() }

// Delivered counts a delivered message (outbox.Observer).
func (m *Metrics) Delivered(topic string) { m.outbox.WithLabelValues(topic, "delivered").Inc() }

// Retried counts a failed delivery to be retried (outbox.Observer).
func (m *Metrics) Retried(topic string) { m.outbox.WithLabelValues(topic, "retried").Inc() }

// Dead counts a dead-lettered message (outbox.Observer).
func (m *Metrics) Dead(topic string) { m.outbox.WithLabelValues(topic, "dead").Inc() }

// TaskRan counts and times a sweeper task run (sweeper.Observer).
func (m *Metrics) TaskRan(task string, took time.Duration, err error) {
	m.taskRuns.WithLabelValues(task, result(err)).Inc()
	m.taskSeconds.WithLabelValues(task).Observe(took.Seconds())
}

// Pruned counts pruned rows (sweeper.Observer).
func (m *Metrics) Pruned(table string, rows int) { m.pruned.WithLabelValues(table).Add(float64(rows)) }

// Resumed counts a resumed record (sweeper.Observer).
func (m *Metrics) Resumed(workflow string, err error) {
	m.resumes.WithLabelValues(workflow, result(err)).Inc()
}

// Abandoned sets the count of records no known workflow can resume
// (sweeper.Observer).
func (m *Metrics) Abandoned(workflow string, records int) {
	m.abandoned.WithLabelValues(workflow).Set(float64(records))
}

// ParkedRecords sets the count of parked records of a workflow
// (sweeper.Observer).
func (m *Metrics) ParkedRecords(workflow string, records int) {
	m.parkedNow.WithLabelValues(workflow).Set(float64(records))
}

// OldestInFlight sets the age of the oldest record in flight
// (sweeper.Observer).
func (m *Metrics) OldestInFlight(age time.Duration) { m.oldest.Set(age.Seconds()) }

// OldestStuck sets the age of a workflow's oldest stuck record
// (sweeper.Observer).
func (m *Metrics) OldestStuck(workflow string, age time.Duration) {
	m.stuck.WithLabelValues(workflow).Set(age.Seconds())
}

// Metrics observes every part of onceflow that reports.
var (
	_ workflow.Observer = (*Metrics)(nil)
	_ outbox.Observer   = (*Metrics)(nil)
	_ sweeper.Observer  = (*Metrics)(nil)
)
