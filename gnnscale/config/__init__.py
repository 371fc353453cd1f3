from gnnscale.config.compose import compose_config, config_dir
from gnnscale.config.schema import eval_batch_size

__all__ = ["compose_config", "config_dir", "eval_batch_size"]
