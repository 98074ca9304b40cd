"""The error every layer raises for a run-config or node-config value the run cannot use.

Here, below every other module of `common/`, so that a data or model module can refuse a value without
importing the run config (common/run/config.py), which imports them.
"""


class ConfigError(ValueError):
    """A run-config or node-config value that the run cannot use."""
