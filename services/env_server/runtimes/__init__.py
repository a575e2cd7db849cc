"""Sandbox backends (rlrun.env_server.sdk.sandbox), one module each, chosen by `runtime.type`."""
