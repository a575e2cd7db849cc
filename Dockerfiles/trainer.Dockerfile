# syntax=docker/dockerfile:1.7
# rlrun trainer: the base dependencies and the [model] extra (torch: the PyPI wheel carries its
# CUDA libraries; the node's driver comes in through the NVIDIA container runtime), torchrun for
# multi-GPU and multi-node runs (the extra also brings huggingface_hub for the model-download init
# container).
# Layers: the dependencies first, from pyproject.toml's metadata alone (Dockerfiles/requirements.py;
# Dockerfiles/constraints.txt pins them, torch included), then the source with --no-deps.
# The runtime stage keeps a C compiler and the Python headers: Triton (torch.compile, fused
# kernels) compiles its launcher with them on first use.
#   docker build -f Dockerfiles/trainer.Dockerfile -t rlrun-trainer .

FROM python:3.11.11-slim-bookworm AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/rlrun
ENV PATH=/opt/rlrun/bin:$PATH
COPY pyproject.toml Dockerfiles/requirements.py Dockerfiles/constraints.txt /tmp/deps/
RUN python /tmp/deps/requirements.py /tmp/deps/pyproject.toml model > /tmp/deps/requirements.txt \
 && pip install -r /tmp/deps/requirements.txt -c /tmp/deps/constraints.txt
WORKDIR /src
COPY pyproject.toml README.md ./
COPY services ./services
RUN pip install --no-deps . \
 && pip check

FROM python:3.11.11-slim-bookworm
LABEL org.opencontainers.image.title="rlrun-trainer" \
      org.opencontainers.image.description="rlrun trainer: loss, optimizer, FSDP, checkpoints, weight broadcast"
ENV DEBIAN_FRONTEND=noninteractive
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends gcc libc6-dev \
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
EXPOSE 50051 9090 29400
ENTRYPOINT ["rlrun", "serve", "trainer"]
CMD ["--config", "/etc/rlrun/config.toml", "--host", "0.0.0.0", "--port", "50051", "--metrics-port", "9090"]
