"""Scale-out: several processes on one machine (torchrun + DDP, `ddp/`) and several machines (DistDGL,
`distdgl/`). Training itself stays in training/; this package launches the processes, splits the seeds
between them and supplies the trainer's synchronisation (training/sync.py) for DDP."""
