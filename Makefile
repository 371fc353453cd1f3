# gnnscale — `make help` lists the targets. Everything the project needs is installed from here.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.gnnscale-installed
PYTEST_ARGS ?=

.DEFAULT_GOAL := help
.PHONY: help install demo test lint bench bench-storage bench-accuracy bench-train bench-infer bench-memory bench-formations bench-partition bench-cluster-gcn bench-scaling bench-profile bench-recommend bench-outofcore bench-outofcore-infer bench-link clean

help: ## Show this help
	@awk 'BEGIN {FS = ":.*## "}; /^[a-zA-Z_-]+:.*## / {printf "  \033[1m%-16s\033[0m %s\n", $$1, $$2}' $(MAKEFILE_LIST)

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --disable-pip-version-check -q -e '.[dev]'
	@touch $(STAMP)

install: $(STAMP) ## Create .venv and install gnnscale (editable, dev extras); quick when done already

demo: $(STAMP) ## Run the whole pipeline (shard, build-csr, train, infer) on the built-in synthetic graph, then its profile plan
	$(BIN)/gnnscale pipeline
	$(BIN)/gnnscale profile

test: $(STAMP) ## Run the test suite (tiny graphs, CPU, a few minutes)
	$(BIN)/python -m pytest $(PYTEST_ARGS)

lint: $(STAMP) ## ruff check + format check
	$(BIN)/ruff check gnnscale tests scripts
	$(BIN)/ruff format --check gnnscale tests scripts

bench: bench-storage bench-accuracy bench-train bench-infer bench-memory bench-formations bench-partition bench-cluster-gcn bench-scaling bench-profile bench-recommend bench-outofcore bench-outofcore-infer bench-link ## Run every benchmark (large: see scripts/bench_*.py)

bench-storage: $(STAMP) ## Shard + CSC of a 5M-node / 200M-edge synthetic graph (needs ~15 GB disk)
	$(BIN)/python scripts/bench_storage.py

bench-accuracy: $(STAMP) ## +exp=sage_2hop on Cora, CiteSeer, tolokers (../shared/data); SAGE vs MLP
	$(BIN)/python scripts/bench_accuracy.py

bench-train: $(STAMP) ## Epoch time vs a plain DGL loop, 500k nodes / 10M edges
	$(BIN)/python scripts/bench_train.py

bench-infer: $(STAMP) ## Layer-wise vs naive full-graph inference, and --update, 500k nodes
	$(BIN)/python scripts/bench_infer.py

bench-memory: $(STAMP) ## Peak RSS and epoch time vs a plain DGL loop, 200k nodes / 512 features; estimate vs measured
	$(BIN)/python scripts/bench_memory.py

bench-formations: $(STAMP) ## Every formation's preset on Cora, tolokers and synthetic graphs (../shared/data)
	$(BIN)/python scripts/bench_formations.py

bench-partition: $(STAMP) ## gnnscale partition (METIS / random) on 500k- and 2M-node synthetic graphs
	$(BIN)/python scripts/bench_partition.py

bench-cluster-gcn: $(STAMP) ## sampler=cluster_gcn vs DGL's Cluster-GCN recipe, 500k nodes / 10M edges
	$(BIN)/python scripts/bench_cluster_gcn.py

bench-scaling: $(STAMP) ## 1 vs 2 processes (DDP), each gradient compression, local steps, METIS split, 500k nodes
	$(BIN)/python scripts/bench_scaling.py

bench-profile: $(STAMP) ## gnnscale profile's predicted memory vs real train runs (50k-500k synthetic, Cora)
	$(BIN)/python scripts/bench_profile.py

bench-recommend: $(STAMP) ## gnnscale recommend, every node of a 500k-node graph, K=20: time, memory, recall vs exact
	$(BIN)/python scripts/bench_recommend.py

bench-outofcore: $(STAMP) ## sage_2hop on the 5M-node graph, uncapped vs a 3 GB cgroup, default memory settings, 3 rounds (root, ~6 GB disk)
	$(BIN)/python scripts/bench_outofcore.py

bench-outofcore-infer: $(STAMP) ## infer --layerwise (sage_2hop) on the 5M-node graph, uncapped vs a 3 GB cgroup, 3 rounds (root)
	$(BIN)/python scripts/bench_outofcore_infer.py

bench-link: $(STAMP) ## task=link on Cora / CiteSeer / tolokers (../shared/data) and the synthetic graph vs CN, AA, RA, MLP
	$(BIN)/python scripts/bench_link.py

clean: ## Remove generated graphs, runs and benchmark scratch (keeps .venv)
	rm -rf graphs runs outputs bench/tmp
