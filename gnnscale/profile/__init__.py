"""`gnnscale profile`'s package: the plan (graph statistics, full-graph and mini-batch memory, the formation
advice), the measurements (timed training steps against the gather and matmul bounds), the sampler
comparison's table, and the plots. The stage (stages/profile.py) composes them and renders."""
