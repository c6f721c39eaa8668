# Hopper's build, test and demo entry points. The Dockerfile runs the same
# build command as `make build`.
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
GO      ?= go
GOFLAGS_BUILD = -trimpath -ldflags "-s -w -X main.version=$(VERSION)"

.PHONY: all build deps tools helm test test3 check check-long check-3x unit demo vet fmt clean jaeger-check fuzz chromium console-check console-shots docs

all: build

## build: static binary bin/hopper (the Dockerfile runs this same command)
build:
	CGO_ENABLED=0 $(GO) build $(GOFLAGS_BUILD) -o bin/hopper ./cmd/hopper

## deps: install RabbitMQ 4 (the tests' default) and 3.x for the tests and
## the demo when they are missing
deps:
	scripts/install-rabbitmq.sh

## tools: pinned helm and Jaeger all-in-one in .cache/bin (go install; cached,
## several minutes on the first run), and Chromium (apt) for the console's
## browser tests; `make test` needs helm only
tools: helm chromium
	scripts/install-jaeger.sh

chromium:
	scripts/install-chromium.sh

helm:
	scripts/install-helm.sh

## test: what must pass on every change, against a private RabbitMQ 4 node
## the tests start themselves (HOPPER_TEST_RABBITMQ=3 for 3.x): unit tests and
## fuzz seeds, integration tests of every package (broker, loop, sidecar, DLQ
## tools, CLI), chart lint/render and Dockerfile checks. Everything but the
## long suites of `make check`.
LONG_SUITES = /faults$$|/internal/jaegercheck$$|/internal/consolecheck$$|/internal/incidentcheck$$
test: deps helm vet
	$(GO) test -count=1 -timeout 20m $$($(GO) list ./... | grep -Ev '$(LONG_SUITES)')

## test3: the packages that run against a broker, on RabbitMQ 3.x (still
## supported): the same tests as `make test` runs on 4.
BROKER_SUITES = ./broker/ ./cmd/hopper/ ./console/ ./dlq/ ./dlqconn/ ./sidecar/ ./streamsrc/ ./internal/testbroker/
test3: deps
	HOPPER_TEST_RABBITMQ=3 $(GO) test -count=1 -timeout 20m $(BROKER_SUITES)

## check: `make test`, then the long suites: the reduced fault suite (every
## message id accounted for under SIGKILLs, broker restarts and app crashes),
## the Jaeger end-to-end check, the DLQ console in a headless Chromium, the
## incident walk-through docs/incident.md run on a reduced DLQ (check-long),
## and beside them, since both mostly wait on their brokers, the
## broker-level suites and the reduced fault suite again on RabbitMQ 3.x
## (check-3x); then the chart's objects against the KEDA, Prometheus
## Operator and Kubernetes types, and the fuzzers for a bounded number of
## inputs. CI runs it.
check: test tools
	$(MAKE) -j2 --output-sync=target check-long check-3x
	$(MAKE) kubecheck
	$(MAKE) fuzz FUZZTIME=20000x

check-long:
	$(GO) test -count=1 -timeout 25m ./faults/ ./internal/jaegercheck/ ./internal/consolecheck/ ./internal/incidentcheck/

## check-3x: on RabbitMQ 3.x, `make test3` and the fault scenarios where the
## release changes what the broker does (FAULTS_3X: restarts of classic and
## quorum queues, a cluster losing nodes, quorum tiers, the order in which a
## quorum queue hands back a cut consumer's messages, partitions, single
## active consumer, parking, streams and super streams). The others, whose faults are the
## app's, the input's or Hopper's own batching, run on 4.x in check-long and
## on 3.x in `HOPPER_TEST_RABBITMQ=3 make faults`, as does ordering on a
## quorum queue, which 3.10 breaks now and then (docs/brokers.md). The
## broker-alone measurement of a quorum tier's failover runs in `make
## faults` only (HOPPER_FAULTS_BROKER_ALONE=1): it tests the broker, not
## Hopper.
FAULTS_3X = TestFaultMixed|TestFaultMixedQuorum|TestFaultOutage|TestFaultCluster|TestFaultQuorumReturnOrderBrokerAlone|TestFaultPartitionsKillOneOfThree|TestFaultPartitionsSharedByPriority|TestFaultSingleActiveConsumerTakeover|TestFaultScheduled|TestFaultStream|TestFaultSuperStream|TestFaultTiersFullRestartsQuorum
check-3x: test3
	HOPPER_TEST_RABBITMQ=3 $(GO) test -count=1 -timeout 25m -run '^($(FAULTS_3X))$$' ./faults/

## fuzz: the whole delivery path (hostile headers, properties and bodies
## through read -> decide -> copy -> forward, alone and in batches), the
## header mapping, the config loader, the batch encoding and the reading of
## batch answers, the routing rules' evaluation and their reading of a body
## in part (held to encoding/json's) under the Go fuzzer.
## FUZZTIME is a duration or a count of inputs (20000x); `make test` uses a
## count, since a time-bounded run can end in "context deadline exceeded"
## when the deadline falls during an input on a busy machine.
FUZZTIME ?= 60s
fuzz:
	$(GO) test -run='^$$' -fuzz=FuzzDeliveryPath -fuzztime=$(FUZZTIME) ./proxy/
	$(GO) test -run='^$$' -fuzz=FuzzBuildHeaders -fuzztime=$(FUZZTIME) ./app/
	$(GO) test -run='^$$' -fuzz=FuzzParse -fuzztime=$(FUZZTIME) ./config/
	$(GO) test -run='^$$' -fuzz=FuzzRead -fuzztime=$(FUZZTIME) ./batch/
	$(GO) test -run='^$$' -fuzz=FuzzEval -fuzztime=$(FUZZTIME) ./route/
	$(GO) test -run='^$$' -fuzz=FuzzDecodeMembers -fuzztime=$(FUZZTIME) ./route/

## jaeger-check: one message failing twice then accepted shows as one trace in a
## real Jaeger (publisher span, three attempts, two retry moves)
jaeger-check: deps tools
	$(GO) test -count=1 -v ./internal/jaegercheck/

## incident: every command of docs/incident.md run, in order, against the
## full DLQ the page starts from (119,762 messages; several minutes), each
## output compared with the page's; `make check` runs it on a reduced DLQ
.PHONY: incident
incident: deps
	HOPPER_INCIDENT_FULL=1 $(GO) test -count=1 -v -timeout 60m ./internal/incidentcheck/

## console-check: the DLQ console in a headless Chromium against a private broker:
## failure groups, message view, replay and purge of a group, hostile content shown as
## text, quorum and classic DLQs of two subscriptions, SIGKILL mid-replay losing nothing
console-check: deps chromium
	$(GO) test -count=1 -v ./internal/consolecheck/

## console-shots: docs/console-overview.png and docs/console-group.png, screenshots of
## the console over a seeded DLQ (the README shows them)
console-shots: deps chromium
	CONSOLE_SHOTS=$(CURDIR)/docs $(GO) test -count=1 -run TestConsoleShots -v ./internal/consolecheck/

## unit: tests that need no broker (pure logic: outcome table, header
## contract, loop, app side, acker, config, DLQ tools against fakes)
unit:
	$(GO) test -count=1 -skip 'TestCLI|TestExclusive|TestBrowse|TestConsumerHolds|TestLive' ./retry/ ./config/ ./dlq/ ./topology/ \
		./proxy/ ./msg/ ./app/ ./telemetry/ ./internal/backoff/ ./broker/ ./console/

## demo: broker + example app + Hopper + one message per outcome, end to end
demo: deps build
	$(GO) run ./examples/demo --hopper-bin bin/hopper

## vet: gofmt, go vet, and go.mod/go.sum exactly as `go mod tidy` leaves them
vet:
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { echo "gofmt needed:"; gofmt -l $$(git ls-files '*.go'); exit 1; }
	@$(GO) mod tidy -diff || { echo "go.mod/go.sum differ from what go mod tidy leaves (run go mod tidy)"; exit 1; }
	$(GO) vet ./...

## docs: the configuration reference docs/configuration.md, and the key
## descriptions `hopper config explain` prints (config/docs_gen.go), generated
## from the config's types, doc comments and defaults (same as
## `go generate ./config/`); a test in ./config/ fails while either is stale
docs:
	$(GO) generate ./config/

clean:
	rm -rf bin

.PHONY: chart-test
.PHONY: docker-check

## chart-test: helm lint + helm template of charts/hopper (ci/*.yaml values and a parent chart);
## manifests decoded strictly into the Kubernetes API types; rendered config run through
## `hopper config validate`. Installs the pinned helm into .cache/bin when missing.
chart-test:
	scripts/install-helm.sh
	$(GO) test -count=1 -run 'TestChart|TestKustomize' ./internal/packaging/
	$(MAKE) kubecheck

## kubecheck: the chart's KEDA and Prometheus Operator objects decoded strictly
## into those projects' own types, and every PromQL expression of the alerts
## and the Grafana dashboard parsed and checked against a live /metrics. A
## module of its own (internal/kubecheck), so none of it is in hopper's go.mod.
.PHONY: kubecheck
kubecheck:
	@cd internal/kubecheck && { $(GO) mod tidy -diff || { echo "internal/kubecheck: go.mod/go.sum differ from what go mod tidy leaves"; exit 1; }; }
	cd internal/kubecheck && $(GO) vet ./...
	cd internal/kubecheck && $(GO) test -count=1 ./...

## docker-check: the Dockerfile builds with `make build` and ends in a non-root, shell-free
## distroless stage; the binary `make build` makes is static. Builds the image too when a
## docker engine is available (none on the CI machines).
docker-check:
	$(GO) test -count=1 -run 'TestDockerfile|TestDockerignore|TestBinaryIsStatic' ./internal/packaging/
	@if command -v docker >/dev/null 2>&1 && docker info >/dev/null 2>&1; then \
		docker build --build-arg VERSION=$(VERSION) -t hopper:$(VERSION) . ; \
	else \
		echo "docker-check: no docker engine here; image build skipped (Dockerfile checked statically)"; \
	fi

.PHONY: bench

## bench: Hopper against the raw amqp091-go limit on a private RabbitMQ node,
## and a healthy queue alone against beside a poison-heavy one in one Hopper
## (the "bench: fair" line), Hopper at its own defaults against the raw limit
## (the "bench: defaults" line) and against itself at --prefetch/--workers in the same
## runs (the "bench: defaults-fixed" line), and against fixed settings on a 20ms app (the
## "bench: slow20ms" line), and 32 messages per request against the raw loop, the
## broker's floor and a hand-written batching loop (the "bench: batch", "batch-raw" and
## "batch-retry" lines); `--paths keyed` (never by default) drains a backlog answered after 1ms
## unordered, with 1000 and 16 ordering keys, and one key against consumer.ordered (the
## "bench: keyed" lines); `--paths stream` (never by default) drains a --stream-n backlog
## (200,000) from a RabbitMQ stream with a hand-written stream-client loop, Hopper per message
## and Hopper in batches (the "bench: stream" and "stream-batch" lines; with --raw-contract
## also the loop sending the contract's request headers, the "contract: stream" lines);
## `--paths stream-defaults` (never by default) compares the peak RSS of a stream and a queue
## subscription at Hopper's defaults on the same backlog (the "bench: stream-defaults" line);
## quick forms: make bench BENCHFLAGS="--n 20000 --runs 1"
## and BENCHFLAGS="--n 20000 --runs 1 --paths fair" (or --paths batch)
BENCHFLAGS ?=
bench: deps
	CGO_ENABLED=0 $(GO) build -o bin/hopperbench ./bench/hopperbench
	bin/hopperbench $(BENCHFLAGS)

.PHONY: faults

## faults: the fault suite with N=5000 messages per scenario: mixed and mixed-quorum (broker
## restart, hopper SIGKILL, app crash and flapping, refused DLQ moves, every app error class),
## batch (the same with batches of up to 16 answered entry by entry),
## ordered and ordered-quorum (40 ordering keys through the same app mix, a hopper SIGKILL,
## a broker restart and an app crash: per key, the first 2xx of each message in publish order),
## ordered-batch (an ordered queue in batches, every broker connection closed while a batch's
## head is held in place: nothing of the closed channel sent again, the last 2xx in order),
## single-active-consumer (two processes, the active one SIGKILLed) and partitions (three processes on
## four partitions, one SIGKILLed),
## outage, cluster (quorum leader's node SIGKILLed, another stopped), poison-burst,
## poison-crash, overload, subscriptions (two queues in one hopper, one failing every
## message, each accounted for on its own) and stream (a stream read with the same app mix,
## hopper SIGKILLed three times while it flows); every message id is accounted for (acked or in the DLQ with a
## reason, lost=0); big-messages (hopper at its defaults in 64 and 128 MiB memory cgroups
## against backlogs of 1 and 8 MiB messages: every one acked, no OOM kill); classic-tier-restart
## (the broker alone, 5 graceful restarts and 5 SIGKILLs per pair of tier and work queue
## types: a quorum tier loses nothing, what a classic one loses is reported). Output also in
## faults.log.
faults: SHELL := /bin/bash
faults: .SHELLFLAGS := -o pipefail -c
faults: deps
	HOPPER_FAULTS_N=5000 HOPPER_FAULTS_TIER_RESTARTS=5 HOPPER_FAULTS_BROKER_ALONE=1 $(GO) test -count=1 -v -run TestFault -timeout 60m ./faults/ 2>&1 | tee faults.log

.PHONY: tier-restarts

## tier-restarts: Hopper at its default delay tiers (quorum queues) through 50 graceful broker
## restarts and 10 SIGKILLs of the node, each while the tiers hold retries, on a classic and a
## quorum work queue, every message accounted for (lost=0); then the broker alone through 10
## rounds per pair of tier and work queue types and way down, reported (about an hour; log in
## tier-restarts.log;
## TIER_TYPE=classic runs Hopper's rounds on classic tiers instead)
TIER_TYPE ?=
tier-restarts: SHELL := /bin/bash
tier-restarts: .SHELLFLAGS := -o pipefail -c
tier-restarts: deps
	HOPPER_FAULTS_TIER_TYPE=$(TIER_TYPE) HOPPER_FAULTS_TIER_ROUNDS=50 HOPPER_FAULTS_TIER_RESTARTS=10 \
		$(GO) test -count=1 -v -run 'TestFaultTiersFullRestarts|TestFaultTierRestartBrokerAlone' -timeout 150m ./faults/ 2>&1 | tee tier-restarts.log

.PHONY: dlq-bench

## dlq-bench: `hopper dlq replay` against a raw get / publish-with-confirm / ack loop and
## against the broker's floor (consume, pipelined publish, multiple-ack) on a private
## RabbitMQ node, in one run: msg/s, ratios, the replay's peak RSS, and a scan of the
## DLQ console over its API (the "bench: console-scan" line) (about 4 minutes;
## quick form: make dlq-bench DLQBENCHFLAGS="--n 20000"; add "--queue-type quorum" to scan
## a quorum DLQ)
DLQBENCHFLAGS ?=
dlq-bench: deps build
	$(GO) run ./bench/dlqbench --hopper-bin bin/hopper $(DLQBENCHFLAGS)

.PHONY: bench-readme

## bench-readme: make bench and make dlq-bench in one go (BENCHFLAGS and DLQBENCHFLAGS
## as there; output also in bench.log), then, when both succeeded, docs/performance.md's
## performance table rewritten from their summary lines by bench/benchtable
## (quick form: make bench-readme BENCHFLAGS="--n 20000 --runs 1" DLQBENCHFLAGS="--n 20000")
BENCH_README_CMD = make bench-readme$(if $(strip $(BENCHFLAGS)), BENCHFLAGS="$(strip $(BENCHFLAGS))")$(if $(strip $(DLQBENCHFLAGS)), DLQBENCHFLAGS="$(strip $(DLQBENCHFLAGS))")
bench-readme: SHELL := /bin/bash
bench-readme: .SHELLFLAGS := -o pipefail -c
bench-readme: deps build
	CGO_ENABLED=0 $(GO) build -o bin/hopperbench ./bench/hopperbench
	{ bin/hopperbench $(BENCHFLAGS) && $(GO) run ./bench/dlqbench --hopper-bin bin/hopper $(DLQBENCHFLAGS); } 2>&1 | tee bench.log
	$(GO) run ./bench/benchtable --readme docs/performance.md --command '$(BENCH_README_CMD)' < bench.log
