"""The run: its plans and connections, its parts (progress, phases, the step loop, checkpoints,
evals, the recorder), the trainer client, the run folder and the status service."""
