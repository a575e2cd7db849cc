"""The env-server process: the gRPC servicer, the env hosts, worker pools and their workers,
the rollout runner, logs and metrics."""
