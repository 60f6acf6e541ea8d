"""The error of every config check: pipeline.dag's and each method's (pipeline.methods)."""


class ConfigError(ValueError):
    """A config value is invalid; the message names the key and what is allowed."""
