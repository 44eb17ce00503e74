# syntax=docker/dockerfile:1
# One image for the hook server and the member tool: the hook's Deployment runs /hook-server,
# member Jobs run /etcdops-member, and etcd pods copy /etcdops-member in with an init
# container (official etcd images have no shell, so nothing here needs one either).

ARG GO_VERSION=1.26

FROM golang:${GO_VERSION} AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN --mount=type=cache,target=/go/pkg/mod go mod download
COPY . .
# Static binaries: no libc in the runtime image.
ENV CGO_ENABLED=0
RUN --mount=type=cache,target=/go/pkg/mod --mount=type=cache,target=/root/.cache/go-build \
    go build -trimpath -ldflags="-s -w" -o /out/hook-server ./cmd/hook-server && \
    go build -trimpath -ldflags="-s -w" -o /out/etcdops-member ./cmd/etcdops-member

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/hook-server /hook-server
COPY --from=build /out/etcdops-member /etcdops-member
USER 65532:65532
EXPOSE 8080
ENTRYPOINT ["/hook-server"]
