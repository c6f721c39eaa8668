# Hopper's build, test and demo entry points. The Dockerfile runs the same
# build command as `make build`.
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
GO      ?= go
GOFLAGS_BUILD = -trimpath -ldflags "-s -w -X main.version=$(VERSION)"

.PHONY: all build deps test unit demo vet fmt clean

all: build

## build: static binary bin/hopper (the Dockerfile runs this same command)
build:
	CGO_ENABLED=0 $(GO) build $(GOFLAGS_BUILD) -o bin/hopper ./cmd/hopper

## deps: install RabbitMQ for the tests and the demo when it is missing
deps:
	scripts/install-rabbitmq.sh

## test: every test, against a private RabbitMQ node the tests start themselves
test: deps vet
	$(GO) test -count=1 -timeout 25m ./...

## unit: tests that need no broker
unit:
	$(GO) test -count=1 ./retry/ ./config/ ./dlq/ ./topology/ ./proxy/ ./msg/

## demo: broker + example app + Hopper + one message per outcome, end to end
demo: deps build
	$(GO) run ./examples/demo --hopper-bin bin/hopper

vet:
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { echo "gofmt needed:"; gofmt -l $$(git ls-files '*.go'); exit 1; }
	$(GO) vet ./...

clean:
	rm -rf bin
