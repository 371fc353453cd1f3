"""gnnscale: a command-line pipeline for graph neural networks on graphs that outgrow the tutorial."""

from gnnscale.utils.quiet import quiet_import_notices

__version__ = "0.1.0"

quiet_import_notices()  # before any module imports torch's or DGL's noisy parts
