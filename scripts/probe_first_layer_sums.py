"""Probe of a design for issue 26 (out of core at disk speed): sum each batch's first SAGE layer as the sweep
passes, instead of holding its input rows.

Today's sweep (training/sweep.py) holds every input row of every batch in flight until the batch is
gathered; on the 5M-node bench a batch needs 148k rows (76 MB), so a 3 GB cap carries about 18 batches per
pass over the 2.56 GB feature file, and the 2M-node / 1.5 GB bench about 4. A SAGE mean / gcn layer with
in <= out only needs, per destination of blocks[0], the sum of its in-neighbours' rows and its own row:
about 11k destinations, 2 x 11k x 512 B plus the edge lists, 5-6x fewer bytes. This script measured,
before training used it (training/sum_sweep.py), what such a sweep costs on the real graph:

  1. a cohort of --batches batches sampled with gnnscale's sampler (sage_2hop, fanouts [15,10], 1024;
     by_source=True: each destination's input-layer edges in ascending source id);
  2. one O_DIRECT pass over the feature file (FeatureReader.read_span, 32 MB chunks, the next one read
     while the last is added), every chunk's edges added into the cohort's running sums
     (training/first_sums.CohortSums: one index_add_ per chunk, equal to DGL's sum in that edge order);
  3. the model step both ways on the same batches: in RAM (gather x, forward, backward) and from the
     sums (GNN.forward(first=...)), checking the outputs are bit-equal.

Writes bench/results/probe_first_layer_sums.json:
    .venv/bin/python scripts/probe_first_layer_sums.py --graph-dir bench/tmp/outofcore/graph
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--graph-dir", default=str(ROOT / "bench" / "tmp" / "outofcore" / "graph"))
    ap.add_argument("--batches", type=int, default=24, help="the cohort one pass serves")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "probe_first_layer_sums.json"))
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    import dgl

    from gnnscale.models import GNN
    from gnnscale.sampling.graph import csc_to_dgl
    from gnnscale.sampling.neighbor import NeighborBlockSampler
    from gnnscale.storage.csc import load_csc
    from gnnscale.storage.feature_reader import FeatureReader
    from gnnscale.storage.feature_store import FeatureStore
    from gnnscale.storage.graph_dir import GraphDir
    from gnnscale.training.first_sums import CohortSums
    from gnnscale.utils.atomic import write_json

    g = GraphDir(args.graph_dir)
    indptr, indices = load_csc(g, resident=True)
    graph = csc_to_dgl(indptr, indices, g.num_nodes)
    n, d = g.num_nodes, int(g.meta["feat_dim"])
    torch.manual_seed(0)
    dgl.seed(0)
    sampler = NeighborBlockSampler([15, 10], by_source=True)
    seeds = torch.randperm(n)[: 1024 * args.batches]
    t0 = time.perf_counter()
    batches = [sampler.sample_blocks(graph, seeds[i * 1024 : (i + 1) * 1024]) for i in range(args.batches)]
    sample_s = (time.perf_counter() - t0) / args.batches

    reader = FeatureReader(g)
    starts = reader.spans((32 << 20) // reader.row_bytes)
    tp = time.perf_counter()
    cohort = CohortSums([(inp, blocks[0]) for inp, _, blocks in batches], starts, d)
    plan_s = time.perf_counter() - tp
    bufs = [reader.span_buffer(int(np.diff(starts).max())) for _ in range(2)]
    t0, cpu0 = time.perf_counter(), time.thread_time()
    wait_s = add_s = 0.0
    job = reader.read_span(starts[0], starts[1], bufs[0])
    for c in range(len(starts) - 1):
        lo, hi = int(starts[c]), int(starts[c + 1])
        tw = time.perf_counter()
        chunk = job.result().view(torch.float32).view(hi - lo, d)
        wait_s += time.perf_counter() - tw
        if c + 2 < len(starts):  # the next chunk read while this one is added
            job = reader.read_span(starts[c + 1], starts[c + 2], bufs[(c + 1) % 2])
        ta = time.perf_counter()
        cohort.add(c, chunk)
        add_s += time.perf_counter() - ta
    pass_s = time.perf_counter() - t0
    pass_cpu = time.thread_time() - cpu0
    reader.close()

    # The model step both ways, on the same batches (no optimizer step: both see the same weights).
    feats = FeatureStore(g, in_memory=True)
    model = GNN("sage", d, 256, 16, 2, aggregator="mean", dropout=0.5, norm="batch").train()
    equal, ram_s, sums_s, gather_s = True, [], [], []
    for i, (inp, _, blocks) in enumerate(batches):
        y = torch.randint(0, 16, (blocks[-1].num_dst_nodes(),))
        outs = []
        for way in ("ram", "sums"):
            torch.manual_seed(i)  # the same dropout masks both ways
            tg = time.perf_counter()
            x = feats.gather(inp) if way == "ram" else None
            gather_s.append(time.perf_counter() - tg) if way == "ram" else None
            t1 = time.perf_counter()
            model.zero_grad()
            out = model(blocks, x, first=None if way == "ram" else cohort.batch(i))
            torch.nn.functional.cross_entropy(out, y).backward()
            (ram_s if way == "ram" else sums_s).append(time.perf_counter() - t1)
            outs.append(out.detach())
        equal &= bool(torch.equal(*outs))
    per_batch_edges = len(cohort.row) / args.batches
    result = {
        "graph_dir": str(g.path),
        "num_nodes": n,
        "feat_dim": d,
        "cohort_batches": args.batches,
        "threads": args.threads,
        "per_batch": {
            "input_rows": float(np.mean([len(b[0]) for b in batches])),
            "first_layer_dst": cohort.offsets[-1] / args.batches,
            "first_layer_edges": per_batch_edges,
            "rows_bytes_mb": float(np.mean([len(b[0]) for b in batches])) * d * 4 / 1e6,
            "cohort_bytes_mb": cohort.nbytes / args.batches / 1e6,
            "sample_s": round(sample_s, 4),
        },
        "pass": {
            "chunks": len(starts) - 1,
            "seconds": round(pass_s, 3),
            "cpu_s": round(pass_cpu, 3),
            "waiting_for_disk_s": round(wait_s, 3),
            "adding_s": round(add_s, 3),
            "cpu_s_per_batch": round(pass_cpu / args.batches, 4),
            "gb_read": round(reader.stats["bytes_read"] / 1e9, 3),
            "cohort_plan_s": round(plan_s, 3),
        },
        "step_s_median": {
            "gather_in_ram": round(float(np.median(gather_s)), 4),
            "in_ram_forward_backward": round(float(np.median(ram_s)), 4),
            "from_sums_forward_backward": round(float(np.median(sums_s)), 4),
        },
        "outputs_bit_equal": equal,
    }
    write_json(args.out, result)
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
