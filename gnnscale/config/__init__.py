from gnnscale.config.compose import compose_config, config_dir

__all__ = ["compose_config", "config_dir"]
