"""DistDGL (`dist=distdgl`): graph servers hold the partitions, trainers sample through them.

  partition.py  graph_dir -> graph_dir/partitions/distdgl-<P>/ (dgl.distributed.partition_graph, METIS)
  launch.py     `gnnscale train dist=distdgl`: this machine's servers and trainers, started and watched
  hosts.py      ip_config, this machine's rank, ports, the command each machine runs
  procs.py      the child processes, ended together; one job per machine (shared memory)
  server.py     a graph server process;  trainer.py  a trainer process (DDP over gloo)
  loop.py       a training epoch / evaluation on a DistGraph;  infer.py  layer-wise inference into DistTensors
  report.py     summary.json and the table

Imports here stay lazy: server and trainer processes start by importing this package.
"""

from __future__ import annotations


def run_train(cfg) -> dict:
    """The whole `gnnscale train dist=distdgl` on this machine; the summary dict (with "run_dir" on machine 0)."""
    from gnnscale.dist.distdgl.launch import run_train as _run_train

    return _run_train(cfg)


__all__ = ["run_train"]
