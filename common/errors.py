"""The error every layer raises for a run-config or node-config value the run cannot use.

Here, below every other module of `common/`, so that a data or model module can refuse a value without
importing the run config's parts (common/keys.py and each floor's settings, composed by common/run/config.py),
which import them.
"""


class ConfigError(ValueError):
    """A run-config or node-config value that the run cannot use."""
