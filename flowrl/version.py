"""flowrl's version: its own module, so any layer reads it without importing the public names."""

__version__ = "0.1.0"
