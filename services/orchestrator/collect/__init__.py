"""Collecting rollout groups: the env-server client, the task sampler, the scheduler that keeps
groups in flight within the staleness bound, the retry policy, and the eval's rollouts."""
