"""`rlrun eval`: the eval envs against a checkpoint or an OpenAI-compatible endpoint."""
