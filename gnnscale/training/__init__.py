"""Training internals: data path, batch prefetching, loop, evaluation, checkpoints, schedules, precision."""
