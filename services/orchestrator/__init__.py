"""The orchestrator: compiles the run into generation plans, schedules rollout groups on the
env-servers with bounded staleness, turns traces into training batches through the algorithm
registry, and drives the trainer step by step. It never imports torch."""
