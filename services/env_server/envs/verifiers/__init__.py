"""verifiers v1 environments hosted by the env-server (`id = "vf:<name>"`, docs/verifiers.md)."""
