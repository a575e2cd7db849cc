# syntax=docker/dockerfile:1.7
# rlrun orchestrator. No torch: the base dependencies only ([monitor] tracking is not installed).
# Layers: the dependencies first, from pyproject.toml's metadata alone (Dockerfiles/requirements.py
# prints the base dependencies; Dockerfiles/constraints.txt pins them), then the
# source with --no-deps, so a source change rebuilds only the last layer.
#   docker build -f Dockerfiles/orchestrator.Dockerfile -t rlrun-orchestrator .

FROM python:3.11.11-slim-bookworm AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/rlrun
ENV PATH=/opt/rlrun/bin:$PATH
COPY pyproject.toml Dockerfiles/requirements.py Dockerfiles/constraints.txt /tmp/deps/
RUN python /tmp/deps/requirements.py /tmp/deps/pyproject.toml > /tmp/deps/requirements.txt \
 && pip install -r /tmp/deps/requirements.txt -c /tmp/deps/constraints.txt
WORKDIR /src
COPY pyproject.toml README.md ./
COPY services ./services
RUN pip install --no-deps . \
 && pip check \
 && python -c "import rlrun.orchestrator, sys; assert 'torch' not in sys.modules"

FROM python:3.11.11-slim-bookworm
LABEL org.opencontainers.image.title="rlrun-orchestrator" \
      org.opencontainers.image.description="rlrun orchestrator: tasks, plan, algorithms, batching, status API"
RUN useradd --uid 10001 --user-group --create-home --home-dir /home/rlrun --shell /usr/sbin/nologin rlrun
COPY --from=build /opt/rlrun /opt/rlrun
WORKDIR /app
COPY configs ./configs
# configs/models and configs/tokenizer link to the package data in services/common/builtin.
COPY services/common/builtin ./services/common/builtin
ENV PATH=/opt/rlrun/bin:$PATH PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
USER 10001:10001
EXPOSE 50051 9090
ENTRYPOINT ["rlrun", "serve", "orchestrator"]
CMD ["--config", "/etc/rlrun/config.toml", "--host", "0.0.0.0", "--port", "50051", "--metrics-port", "9090"]
