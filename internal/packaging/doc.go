// Package packaging holds the tests of Hopper's packaging: the Dockerfile
// (it runs the Makefile's build and ends in a non-root distroless stage) and
// the Helm chart in charts/hopper (helm lint, helm template over the values
// files in charts/hopper/ci and a parent chart that includes the sidecar,
// the rendered manifests decoded strictly into the Kubernetes API types, and
// the rendered Hopper config checked by `hopper config validate`).
//
// The chart tests need helm: $HELM, or .cache/bin/helm as installed by
// scripts/install-helm.sh. Outside CI the tests run that script when helm is
// missing; in CI (CI=true) a missing helm fails the run.
package packaging
