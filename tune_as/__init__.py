"""tune_as: hyper-parameter search and scaling for softmax-variant losses."""

__version__ = "0.1.0"
