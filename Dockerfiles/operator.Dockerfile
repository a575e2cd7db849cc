# syntax=docker/dockerfile:1.7
# rlrun operator (kopf). No torch: the base dependencies and the [operator] extra.
# Layers: the dependencies first, from pyproject.toml's metadata alone (Dockerfiles/requirements.py
# prints the base dependencies and the [operator] extra; Dockerfiles/constraints.txt pins them), then the
# source with --no-deps, so a source change rebuilds only the last layer.
#   docker build -f Dockerfiles/operator.Dockerfile -t rlrun-operator .

FROM python:3.11.11-slim-bookworm AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/rlrun
ENV PATH=/opt/rlrun/bin:$PATH
COPY pyproject.toml Dockerfiles/requirements.py Dockerfiles/constraints.txt /tmp/deps/
RUN python /tmp/deps/requirements.py /tmp/deps/pyproject.toml operator > /tmp/deps/requirements.txt \
 && pip install -r /tmp/deps/requirements.txt -c /tmp/deps/constraints.txt
WORKDIR /src
COPY pyproject.toml README.md ./
COPY services ./services
RUN pip install --no-deps . \
 && pip check \
 && python -c "import rlrun.operator.handlers, sys; assert 'torch' not in sys.modules"

FROM python:3.11.11-slim-bookworm
LABEL org.opencontainers.image.title="rlrun-operator" \
      org.opencontainers.image.description="rlrun operator: reconciles RLRun resources into pods"
RUN useradd --uid 10001 --user-group --create-home --home-dir /home/rlrun --shell /usr/sbin/nologin rlrun
COPY --from=build /opt/rlrun /opt/rlrun
ENV PATH=/opt/rlrun/bin:$PATH PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
USER 10001:10001
EXPOSE 8080
ENTRYPOINT ["rlrun", "operator"]
CMD ["--all-namespaces", "--liveness-port", "8080"]
