# syntax=docker/dockerfile:1.7
# rlrun inference on GPUs: a CUDA runtime base, the base dependencies and the [model], [serve]
# and [vllm] extras (`--set inference.engine` or the RLRun's spec.inference.engine picks vLLM; the
# torch engine stays available). vLLM brings transformers and huggingface_hub (tokenizers, the
# model-download init container).
# Layers: the dependencies first, from pyproject.toml's metadata alone (Dockerfiles/requirements.py;
# vLLM's own pins decide torch, so no constraints file), then the source with --no-deps.
# The runtime stage keeps a C compiler and the Python headers: vLLM's Triton kernels compile
# their launcher with them on first load.
#   docker build -f Dockerfiles/inference.Dockerfile -t rlrun-inference .

FROM nvidia/cuda:12.6.3-runtime-ubuntu24.04 AS build
ENV DEBIAN_FRONTEND=noninteractive PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3.12 python3.12-venv python3.12-dev build-essential \
 && rm -rf /var/lib/apt/lists/*
RUN python3.12 -m venv /opt/rlrun
ENV PATH=/opt/rlrun/bin:$PATH
COPY pyproject.toml Dockerfiles/requirements.py /tmp/deps/
RUN python /tmp/deps/requirements.py /tmp/deps/pyproject.toml model serve vllm > /tmp/deps/requirements.txt \
 && pip install -r /tmp/deps/requirements.txt
WORKDIR /src
COPY pyproject.toml README.md ./
COPY services ./services
RUN pip install --no-deps .

FROM nvidia/cuda:12.6.3-runtime-ubuntu24.04
LABEL org.opencontainers.image.title="rlrun-inference" \
      org.opencontainers.image.description="rlrun inference: vLLM and torch engines, gRPC and OpenAI-compatible HTTP"
ENV DEBIAN_FRONTEND=noninteractive
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3.12 python3.12-dev build-essential \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --uid 10001 --user-group --create-home --home-dir /home/rlrun --shell /usr/sbin/nologin rlrun
COPY --from=build /opt/rlrun /opt/rlrun
ENV PATH=/opt/rlrun/bin:$PATH PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 CC=gcc
# What Triton's JIT needs at run time: a C compiler and Python.h of the interpreter that runs it.
RUN cc --version \
 && python -c "import os, sysconfig; assert os.path.exists(os.path.join(sysconfig.get_paths()['include'], 'Python.h'))"
WORKDIR /app
COPY configs ./configs
# configs/models and configs/tokenizer link to the package data in services/common/builtin.
COPY services/common/builtin ./services/common/builtin
USER 10001:10001
EXPOSE 50051 9090 8000
ENTRYPOINT ["rlrun", "serve", "inference"]
CMD ["--config", "/etc/rlrun/config.toml", "--host", "0.0.0.0", "--port", "50051", "--metrics-port", "9090"]
