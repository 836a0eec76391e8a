# The image deploy/kubernetes/strata-agent.yaml runs (registry.example/strata:0.1.0):
#   docker build -t registry.example/strata:0.1.0 .
# One binary for every role: `strata agent` (the DaemonSet), `strata serve` (the collector, which
# finds its web UI in /usr/local/share/strata/web), `strata report` / `diagnose`.
FROM debian:bookworm AS build
COPY scripts/install-deps.sh /src/scripts/install-deps.sh
# The build's packages only: the testbed (python3-torch, clickhouse, chromium) is not built here.
RUN apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
      build-essential cmake make pkg-config clang llvm libbpf-dev bpftool libelf-dev libdw-dev zlib1g-dev \
      libsqlite3-dev libzstd-dev libprotobuf-dev protobuf-compiler libcpp-httplib-dev libssl-dev \
      libgtest-dev libgmock-dev libcli11-dev nlohmann-json3-dev nodejs npm ca-certificates \
    && rm -rf /var/lib/apt/lists/*
COPY . /src
WORKDIR /src
RUN cmake -S . -B /build -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSTRATA_BUILD_TESTBED=OFF \
    && cmake --build /build -j"$(nproc)" --target strata strata_web \
    && cmake --install /build --prefix /usr/local

FROM debian:bookworm-slim
RUN apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
      libbpf1 libelf1 libdw1 zlib1g libsqlite3-0 libzstd1 libprotobuf32 libcpp-httplib0.11 libssl3 \
      ca-certificates \
    && rm -rf /var/lib/apt/lists/*
COPY --from=build /usr/local/bin/strata /usr/local/bin/strata
COPY --from=build /usr/local/share/strata /usr/local/share/strata
ENTRYPOINT ["/usr/local/bin/strata"]
CMD ["--help"]
