"""Training: the trainer and its pieces.

- trainer.py      epochs, evaluation, early stopping, checkpoints and exact resume, metrics, callbacks
- loop.py         one epoch (timed in parts) and one evaluation pass, the task supplying loss and metrics
- build.py        factories: config + data -> streams, model, optimizer, trainer; the memory pre-flight
- memory_plan.py  what a run will hold in memory, the decisions that fit a budget, and refusals
- batches.py      BatchStream: features gathered for each Batch into a shared ring of buffers
- data.py         the training data: mmap'd CSC, features, labels, splits
- callbacks.py    console progress; report.py summary.json; resume.py which run continues
- phases.py       train.phases: per-phase batch size and fanouts, the phase of an epoch
- diagnostics.py  train.diagnostics: batch label mix, loss / gradient spread, overlap, over-smoothing
- seeding.py      per-epoch seeds and RNG state; schedule.py, precision.py, options.py
"""
