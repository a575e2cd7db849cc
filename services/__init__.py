"""rlrun: asynchronous RL post-training of language models as gRPC microservices."""

__version__ = "0.1.0"
