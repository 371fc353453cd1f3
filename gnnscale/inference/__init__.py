"""Inference: exact layer-wise embeddings of every node, sampled inference for a few, incremental updates.

- checkpoint.py  find, load (weights_only) and check a train checkpoint against a graph
- blocks.py      full-neighbour DGL blocks from CSC rows (with an optional edge delta)
- layerfile.py   one layer's rows as a memory-mapped .npy, kept resident or streamed from disk
- streamfile.py  layer files written / read once front to back, O_DIRECT from a background thread
- layerwise.py   layer by layer over all (or the affected) nodes; conv outputs cached for --update
- sampled.py     mini-batch sampled inference for a node subset
- delta.py       changes.npz, the cumulative graph delta and the updated graph_dir
- incremental.py which nodes each layer must recompute after a change
- update.py      an update's layers: delta, full, rows or reused, chosen per layer
- propagate.py   delta propagation through SAGE 'mean' / 'gcn' layers from cached conv outputs
- projected.py   a narrowing layer recomputed from projections collected by the previous pass
"""
