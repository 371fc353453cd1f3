"""Inference: exact layer-wise embeddings of every node, sampled inference for a few, incremental updates.

- job.py         an infer run's shared steps: options, layers into run_dir, published outputs, summary
- update_run.py  --update: the base run, what the change reaches, the update itself
- blocks.py      full-neighbour DGL blocks from CSC rows (with an optional edge delta)
- layerfile.py   one layer's rows as a memory-mapped .npy, kept resident or streamed from disk
- streamfile.py  layer files written / read once front to back, O_DIRECT from a background thread
- layerwise.py   layer by layer over all (or the affected) nodes; conv outputs cached for --update
- sampled.py     mini-batch sampled inference for a node subset (--sampled)
- outputs.py     embeddings / predictions files and emb_info.json (assembled here only)
- delta.py       changes.npz, the cumulative graph delta and the updated graph_dir
- incremental.py which nodes each layer must recompute after a change
- update.py      an update's layers: delta, full, rows or reused, chosen per layer
- propagate.py   delta propagation through SAGE 'mean' / 'gcn' layers from cached conv outputs
- projected.py   a narrowing layer recomputed from projections collected by the previous pass
"""
