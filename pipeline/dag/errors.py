"""The error of every config check (a module of its own: pipeline.dag.config and each method's
checks in pipeline.methods raise it, and the config imports the methods)."""


class ConfigError(ValueError):
    """A config value is invalid; the message names the key and what is allowed."""
