"""graph_dir storage: shard format (DESIGN §4), CSC arrays and the FeatureStore."""
