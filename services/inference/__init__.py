"""The inference service: token-in/token-out generation with the live policy.

Engines (torch on CPU or any torch device, vLLM on GPUs) sit behind one `Engine`
interface; the gRPC InferenceService and the OpenAI-compatible HTTP app are thin shells
over it.
"""
