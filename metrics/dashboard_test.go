package metrics_test

import (
	"encoding/json"
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/onceflow/onceflow/metrics"
)

// dashboard is the Grafana dashboard the docs ship.
const dashboard = "../docs/grafana/onceflow.json"

// metricName finds the metric names in a PromQL expression or a template
// query.
var metricName = regexp.MustCompile(`\bonceflow_[a-z0-9_]+`)

// TestDashboardNamesOnlyMetricsThatExist: every metric the Grafana
// dashboard queries is one metrics.New registers (a histogram's _bucket,
// _count and _sum series included), and every metric it registers has a
// panel.
func TestDashboardNamesOnlyMetricsThatExist(t *testing.T) {
	t.Parallel()
	raw, err := os.ReadFile(dashboard)
	require.NoError(t, err)
	var doc any
	require.NoError(t, json.Unmarshal(raw, &doc), "the dashboard is JSON")

	registered, histograms := registeredMetrics(t)
	queried := map[string]bool{}
	var walk func(v any)
	walk = func(v any) {
		switch v := v.(type) {
		case map[string]any:
			for _, e := range v {
				walk(e)
			}
		case []any:
			for _, e := range v {
				walk(e)
			}
		case string:
			for _, name := range metricName.FindAllString(v, -1) {
				series := name
				for _, suffix := range []string{"_bucket", "_count", "_sum"} {
					if base, ok := strings.CutSuffix(name, suffix); ok && histograms[base] {
						name = base
					}
				}
				require.True(t, registered[name], "the dashboard queries %s, which metrics.New does not register", series)
				queried[name] = true
			}
		}
	}
	walk(doc)
	for name := range registered {
		require.True(t, queried[name], "metrics.New registers %s, and no panel of the dashboard shows it", name)
	}
}

// registeredMetrics are the names of the metrics metrics.New registers,
// and which of them are histograms.
func registeredMetrics(t *testing.T) (names, histograms map[string]bool) {
	t.Helper()
	names, histograms = map[string]bool{}, map[string]bool{}
	fqName := regexp.MustCompile(`fqName: "([^"]+)"`)
	for _, c := range metrics.New().Collectors() {
		descs := make(chan *prometheus.Desc, 16)
		c.Describe(descs)
		close(descs)
		for d := range descs {
			m := fqName.FindStringSubmatch(d.String())
			require.NotNil(t, m, "a metric's description: %s", d)
			names[m[1]] = true
			if _, ok := c.(*prometheus.HistogramVec); ok {
				histograms[m[1]] = true
			}
		}
	}
	return names, histograms
}
