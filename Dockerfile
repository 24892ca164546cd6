# qpool-server and the qpool CLI on Debian 12, the platform qpool is built and tested on.
#   docker build -t qpool:0.1.0 .                                   CUDA build (GPUs and CPUs)
#   docker build --build-arg QPOOL_VARIANT=cpu -t qpool:0.1.0-cpu .  CPU-only, a far smaller image
# The CUDA variant compiles with the CUDA 13 toolkit from NVIDIA's Debian 12 repository and runs
# on the CUDA libraries of the PyTorch wheel; the GPU driver comes from the host (NVIDIA
# container toolkit). The runtime stage installs the Debian packages whose libraries the binaries
# load: tests/integration/test_container.py checks that list against `ldd` of the built binaries,
# and lints this file with hadolint.
ARG DEBIAN_IMAGE=debian:12.12-slim

FROM ${DEBIAN_IMAGE} AS build
ARG QPOOL_VARIANT=cuda
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
ENV DEBIAN_FRONTEND=noninteractive
# hadolint ignore=DL3008
RUN apt-get update -q && apt-get install -y -q --no-install-recommends ca-certificates curl \
    && rm -rf /var/lib/apt/lists/*
# hadolint ignore=DL3008
RUN if [ "$QPOOL_VARIANT" = cuda ]; then \
      curl -fsSL -o /tmp/cuda-keyring.deb \
        https://developer.download.nvidia.com/compute/cuda/repos/debian12/x86_64/cuda-keyring_1.1-1_all.deb \
      && dpkg -i /tmp/cuda-keyring.deb && rm /tmp/cuda-keyring.deb \
      && apt-get update -q \
      && apt-get install -y -q --no-install-recommends cuda-toolkit-13-0 \
      && rm -rf /var/lib/apt/lists/*; \
    fi
ENV PATH=/usr/local/cuda/bin:${PATH}
WORKDIR /src
COPY . .
# setup.sh installs the Debian packages of the build (pinned by the Debian 12 release) and the
# PyTorch wheel (pinned in setup.sh): the CPU wheel where no nvcc is installed. Only the wheel's
# libraries go on to the runtime stage: LibTorch's, and the CUDA libraries beside it.
RUN QPOOL_SETUP=build scripts/setup.sh && rm -rf /var/lib/apt/lists/* \
    && QPOOL_BUILD_DIR=/src/build scripts/build.sh -DQPOOL_BUILD_TESTS=OFF -DQPOOL_BUILD_BENCH=OFF \
    && site=.venv/lib/python3.11/site-packages && mkdir -p /opt/qpool/site-packages/torch \
    && cp -a "$site/torch/lib" /opt/qpool/site-packages/torch/ \
    && if [ -d "$site/nvidia" ]; then cp -a "$site/nvidia" /opt/qpool/site-packages/; fi

FROM ${DEBIAN_IMAGE}
# The shared libraries of qpool-server and qpool (Debian 12 packages; apt adds their own
# dependencies). LibTorch and the CUDA libraries come from the wheel, copied below.
# hadolint ignore=DL3008
RUN apt-get update -q && apt-get install -y -q --no-install-recommends \
      libgrpc++1.51 libprotobuf32 libspdlog1.10 libfmt9 libyaml-cpp0.7 libmicrohttpd12 \
      libsentencepiece0 libssl3 libpcre2-8-0 libutf8proc2 zlib1g \
    && rm -rf /var/lib/apt/lists/*
COPY --from=build /opt/qpool/site-packages /opt/qpool/site-packages
COPY --from=build /src/build/server/qpool-server /src/build/client/qpool /usr/local/bin/
# qpool reaches SentencePiece (FLUX's T5 tokenizer) through this shim, looked up in ../lib/qpool/.
COPY --from=build /src/build/server/libqpool_sentencepiece.so /usr/local/lib/qpool/
# LibTorch, and (CUDA variant) the CUDA runtime the kernels were linked against, which the wheel
# carries as well.
ENV LD_LIBRARY_PATH=/opt/qpool/site-packages/torch/lib:/opt/qpool/site-packages/nvidia/cu13/lib
# Not root: the uid deploy/kubernetes runs the pod as. HOME is writable for per-user caches
# (CUDA's kernel cache).
RUN useradd --system --uid 10001 --user-group --home-dir /tmp --no-create-home qpool
USER 10001
ENV HOME=/tmp
# gRPC, metrics and the HTTP API (deploy/kubernetes passes --metrics-listen and --http-listen).
EXPOSE 50051 9100 8080
# grpc.health.v1 through the CLI: SERVING once the start-up pipelines are loaded. A container
# started with --tls-cert needs its own check (docs/security.md: the CLI with --ca).
HEALTHCHECK --interval=10s --timeout=5s --start-period=600s --retries=3 \
  CMD ["qpool", "--server", "127.0.0.1:50051", "--connect-timeout", "4", "health"]
ENTRYPOINT ["qpool-server", "--model-repository", "/models", "--listen", "0.0.0.0:50051"]
