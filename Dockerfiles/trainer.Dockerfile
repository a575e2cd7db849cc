# syntax=docker/dockerfile:1.7
# rlrun trainer: torch (the PyPI wheel carries its CUDA libraries; the node's driver comes in
# through the NVIDIA container runtime), torchrun for multi-GPU and multi-node runs.
#   docker build -f Dockerfiles/trainer.Dockerfile -t rlrun-trainer .

FROM python:3.11.11-slim-bookworm AS build
ARG TORCH_VERSION=2.13.0
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/rlrun
ENV PATH=/opt/rlrun/bin:$PATH
RUN pip install "torch==${TORCH_VERSION}"
WORKDIR /src
COPY pyproject.toml README.md ./
COPY services ./services
RUN pip install . "torch==${TORCH_VERSION}"

FROM python:3.11.11-slim-bookworm
LABEL org.opencontainers.image.title="rlrun-trainer" \
      org.opencontainers.image.description="rlrun trainer: loss, optimizer, FSDP, checkpoints, weight broadcast"
RUN useradd --uid 10001 --user-group --create-home --home-dir /home/rlrun --shell /usr/sbin/nologin rlrun
COPY --from=build /opt/rlrun /opt/rlrun
WORKDIR /app
COPY configs ./configs
ENV PATH=/opt/rlrun/bin:$PATH PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
USER 10001:10001
EXPOSE 50051 9090 29400
ENTRYPOINT ["rlrun", "serve", "trainer"]
CMD ["--config", "/etc/rlrun/config.toml", "--host", "0.0.0.0", "--port", "50051", "--metrics-port", "9090"]
