# Hopper container image: a static binary on distroless, non-root, nothing
# written at run time (runs with a read-only root filesystem).
#
#   docker build --build-arg VERSION=$(git describe --tags --always) -t hopper .
#   docker run --read-only -v $PWD/hopper.yaml:/etc/hopper/hopper.yaml:ro hopper
#
# The build stage runs `make build`, the very command developers and CI run,
# so the image's binary cannot drift from the tested one
# (internal/packaging checks this file against the Makefile).

ARG GO_VERSION=1.26

# ---- build -----------------------------------------------------------------
# Built on the build machine's platform and cross-compiled (BuildKit, the
# default builder, sets BUILDPLATFORM and TARGETOS/TARGETARCH):
#   docker buildx build --platform linux/amd64,linux/arm64 ...
FROM --platform=$BUILDPLATFORM golang:${GO_VERSION}-bookworm AS build

# The official golang images ship make; install it if a base image lacks it.
RUN command -v make >/dev/null 2>&1 || \
    (apt-get update && apt-get install -y --no-install-recommends make && rm -rf /var/lib/apt/lists/*)

WORKDIR /src

# Dependencies first: this layer is reused until go.mod or go.sum change.
COPY go.mod go.sum ./
RUN go mod download && go mod verify

COPY . .

# VERSION is stamped into the binary (main.version); the Makefile otherwise
# asks git, and .git is not in the build context.
ARG VERSION=dev
# make passes GOOS/GOARCH through to `go build` (CGO is off, so the binary is
# static for every platform); without BuildKit they default to the builder's.
ARG TARGETOS
ARG TARGETARCH
RUN GOOS=${TARGETOS:-$(go env GOOS)} GOARCH=${TARGETARCH:-$(go env GOARCH)} make build VERSION="${VERSION}"

# ---- runtime ---------------------------------------------------------------
# distroless/static: CA certificates, tzdata and /etc/passwd with the nonroot
# user (65532); no shell, no package manager.
FROM gcr.io/distroless/static-debian12:nonroot

ARG VERSION=dev
ARG REVISION=unknown
ARG CREATED=unknown
LABEL org.opencontainers.image.title="hopper" \
      org.opencontainers.image.description="RabbitMQ consumer sidecar: delivers each message to your app over HTTP; the response decides ack, retry or dead-letter" \
      org.opencontainers.image.source="https://github.com/hopper-sidecar/hopper" \
      org.opencontainers.image.url="https://github.com/hopper-sidecar/hopper" \
      org.opencontainers.image.documentation="https://github.com/hopper-sidecar/hopper#readme" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.created="${CREATED}" \
      org.opencontainers.image.base.name="gcr.io/distroless/static-debian12:nonroot"

COPY --from=build /src/bin/hopper /hopper

# The config file is mounted here (the Helm chart mounts its ConfigMap at this
# path). Set HOPPER_CONFIG= (empty) to configure with HOPPER_* variables only.
ENV HOPPER_CONFIG=/etc/hopper/hopper.yaml

USER 65532:65532

# Admin port: /healthz, /readyz, /metrics (admin.listen, default :9090).
EXPOSE 9090

# SIGTERM drains in-flight deliveries within shutdown.grace (default 25s).
STOPSIGNAL SIGTERM
ENTRYPOINT ["/hopper"]
CMD ["run"]
