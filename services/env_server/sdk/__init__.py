"""What an environment author imports (re-exported by `rlrun.env_server`): tasks and tasksets,
environments, episodes and conversations, harnesses, the models a harness talks to, scorers,
env-owned algorithms and the errors a rollout may raise."""
