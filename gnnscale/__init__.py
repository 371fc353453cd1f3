"""gnnscale: a command-line pipeline for graph neural networks on graphs that outgrow the tutorial."""

__version__ = "0.1.0"
