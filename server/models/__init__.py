"""The run's model: loading it from user code, publishing versions, staging uploads."""
