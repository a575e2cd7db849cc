# syntax=docker/dockerfile:1.7
# rlrun inference on GPUs: a CUDA runtime base and the `vllm` extra (`--set inference.engine`
# or the RLRun's spec.inference.engine picks vLLM; the torch engine stays available).
#   docker build -f Dockerfiles/inference.Dockerfile -t rlrun-inference .

FROM nvidia/cuda:12.6.3-runtime-ubuntu24.04 AS build
ENV DEBIAN_FRONTEND=noninteractive PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3.12 python3.12-venv python3.12-dev build-essential \
 && rm -rf /var/lib/apt/lists/*
RUN python3.12 -m venv /opt/rlrun
ENV PATH=/opt/rlrun/bin:$PATH
WORKDIR /src
COPY pyproject.toml README.md ./
COPY services ./services
RUN pip install ".[vllm]"

FROM nvidia/cuda:12.6.3-runtime-ubuntu24.04
LABEL org.opencontainers.image.title="rlrun-inference" \
      org.opencontainers.image.description="rlrun inference: vLLM and torch engines, gRPC and OpenAI-compatible HTTP"
ENV DEBIAN_FRONTEND=noninteractive
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3.12 \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --uid 10001 --user-group --create-home --home-dir /home/rlrun --shell /usr/sbin/nologin rlrun
COPY --from=build /opt/rlrun /opt/rlrun
WORKDIR /app
COPY configs ./configs
ENV PATH=/opt/rlrun/bin:$PATH PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
USER 10001:10001
EXPOSE 50051 9090 8000
ENTRYPOINT ["rlrun", "serve", "inference"]
CMD ["--config", "/etc/rlrun/config.toml", "--host", "0.0.0.0", "--port", "50051", "--metrics-port", "9090"]
