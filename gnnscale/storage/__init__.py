"""On-disk formats, free of DGL: graph_dir (shards, meta.json, CSC arrays, FeatureStore) and run_dir."""
