# dgca-coordinator (and the dgca CLI) on Debian 12, the platform `make` targets.
# Build from the repository root:
#   docker build -f deploy/docker/coordinator.Dockerfile -t dgca-coordinator .
FROM debian:12 AS build
WORKDIR /src
COPY tools/install-deps.sh tools/install-deps.sh
RUN tools/install-deps.sh
COPY . .
# The same build `make` runs (tools/build.sh), limited to the programs.
RUN rm -rf build && tools/build.sh dgca-coordinator dgca-worker dgca

FROM debian:12
RUN apt-get update -qq && apt-get install -y -qq --no-install-recommends \
      libgrpc++1.51 libprotobuf32 libyaml-cpp0.7 libprometheus-cpp-core1.0 \
      libprometheus-cpp-pull1.0 libsqlite3-0 libspdlog1.10 libgloo0 libopenblas0 \
      unicode-data debian-reference-zh-cn manpages-zh bzip2 \
    && rm -rf /var/lib/apt/lists/*
COPY --from=build /src/build/coordinator/dgca-coordinator /usr/local/bin/
COPY --from=build /src/build/worker/dgca-worker /usr/local/bin/
COPY --from=build /src/build/cli/dgca /usr/local/bin/
COPY configs /opt/dgca/configs
VOLUME /var/lib/dgca
EXPOSE 7600 7601
ENTRYPOINT ["dgca-coordinator"]
CMD ["--listen", "0.0.0.0:7600", "--metrics-listen", "0.0.0.0:7601", "--state-dir", "/var/lib/dgca"]
