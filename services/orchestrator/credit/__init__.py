"""Crediting groups and cutting batches: the algorithm registry (`algorithms/`), each env's
credit pipeline, reference scoring, filters, flattening into training samples, and the batch."""
