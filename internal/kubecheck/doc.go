// Package kubecheck checks the chart's custom resources against the types
// of the projects that define them: KEDA's ScaledObject and
// TriggerAuthentication, the Prometheus Operator's PodMonitor,
// ServiceMonitor and PrometheusRule, and every PromQL expression of the
// alerts and the Grafana dashboard with Prometheus's own parser, naming
// only metrics a running Hopper serves.
//
// It is a module of its own so that KEDA, Prometheus and the operator stay
// out of the go.mod of the hopper binary; `make test` runs it.
package kubecheck
