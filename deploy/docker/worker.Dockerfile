# dgca-worker agent on a CUDA runtime base image (ranks train on the GPUs the
# container is given). Build from the repository root:
#   docker build -f deploy/docker/worker.Dockerfile -t dgca-worker .
FROM nvidia/cuda:13.0.0-devel-ubuntu24.04 AS build
ENV DEBIAN_FRONTEND=noninteractive
WORKDIR /src
COPY tools/install-deps.sh tools/install-deps.sh
RUN tools/install-deps.sh
COPY . .
# The same build `make` runs (tools/build.sh), limited to the programs.
RUN rm -rf build && tools/build.sh dgca-coordinator dgca-worker dgca

FROM nvidia/cuda:13.0.0-runtime-ubuntu24.04
ENV DEBIAN_FRONTEND=noninteractive
RUN apt-get update -qq && apt-get install -y -qq --no-install-recommends \
      libgrpc++1.51t64 libprotobuf32t64 libyaml-cpp0.8 libprometheus-cpp-core1.0 \
      libprometheus-cpp-pull1.0 libsqlite3-0 libspdlog1.12 libgloo0 libopenblas0 \
    && rm -rf /var/lib/apt/lists/*
COPY --from=build /src/build/worker/dgca-worker /usr/local/bin/
COPY --from=build /src/build/cli/dgca /usr/local/bin/
VOLUME /var/lib/dgca
ENTRYPOINT ["dgca-worker"]
CMD ["agent", "--coordinator", "coordinator:7600", "--token-file", "/var/lib/dgca/agent-token"]
