"""The package version: the kernel cache keys on it."""
__version__ = "0.1.0"
