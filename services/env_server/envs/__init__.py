"""Built-in environments, one module each (registered by id in rlrun.env_server.envs.registry)."""
