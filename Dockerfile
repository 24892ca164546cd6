# qpool-server image. The CUDA base image supplies nvcc 13 and the driver libraries; Ubuntu 24.04
# carries the same gRPC 1.51 and Protobuf 3.21 as Debian 12. Build: docker build -t qpool .
FROM nvidia/cuda:13.0.0-devel-ubuntu24.04 AS build
ENV DEBIAN_FRONTEND=noninteractive
RUN apt-get update -q && apt-get install -y -q --no-install-recommends \
      build-essential cmake ninja-build git python3 python3-venv python3-dev \
      libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler libspdlog-dev \
      libfmt-dev libyaml-cpp-dev nlohmann-json3-dev libmicrohttpd-dev libsentencepiece-dev \
      zlib1g-dev libssl-dev libgtest-dev libgmock-dev \
      libbenchmark-dev sudo && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
RUN scripts/setup.sh && QPOOL_BUILD_DIR=/src/build scripts/build.sh -DQPOOL_BUILD_TESTS=OFF -DQPOOL_BUILD_BENCH=OFF

FROM nvidia/cuda:13.0.0-runtime-ubuntu24.04
RUN apt-get update -q && apt-get install -y -q --no-install-recommends \
      libgrpc++1.51t64 libprotobuf32t64 libspdlog1.12 libyaml-cpp0.8 libmicrohttpd12t64 \
      libsentencepiece0 libssl3t64 python3 \
    && rm -rf /var/lib/apt/lists/*
COPY --from=build /src/.venv/lib /opt/qpool/venv/lib
COPY --from=build /src/build/server/qpool-server /src/build/client/qpool /usr/local/bin/
# qpool reaches SentencePiece (FLUX's T5 tokenizer) through this shim, looked up in ../lib/qpool/.
COPY --from=build /src/build/server/libqpool_sentencepiece.so /usr/local/lib/qpool/
ENV LD_LIBRARY_PATH=/opt/qpool/venv/lib/python3.12/site-packages/torch/lib
# Not root: the uid deploy/kubernetes runs the pod as. HOME is writable for per-user caches
# (CUDA's kernel cache).
RUN useradd --system --uid 10001 --user-group --home-dir /tmp --no-create-home qpool
USER 10001
ENV HOME=/tmp
EXPOSE 50051 9100
# grpc.health.v1 through the CLI: SERVING once the start-up pipelines are loaded.
HEALTHCHECK --interval=10s --timeout=5s --start-period=600s --retries=3 \
  CMD ["qpool", "--server", "127.0.0.1:50051", "--connect-timeout", "4", "health"]
ENTRYPOINT ["qpool-server", "--model-repository", "/models", "--listen", "0.0.0.0:50051"]
