"""`gnnscale pipeline`'s plan (stages, per-stage configs, what is up to date) and its headline."""
