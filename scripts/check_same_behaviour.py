"""Does a refactor change what gnnscale computes? Record a reference with one source tree, then compare.

Runs, through the `gnnscale` CLI of the source tree given by --src (default: this checkout):
a seeded 3-epoch `train` on the built-in synthetic graph and on Cora (planetoid, from ../shared/data),
then `infer --layerwise` of each checkpoint. `record` keeps each run's metrics.jsonl (computed values
only: times, rates and memory vary from run to run and are dropped) and embeddings.npy; `compare`
checks that a second recording has the same losses and metrics bit for bit and embeddings within 1e-6.

    git worktree add /tmp/gnnscale-base HEAD
    .venv/bin/python scripts/check_same_behaviour.py record /tmp/ref --src /tmp/gnnscale-base
    .venv/bin/python scripts/check_same_behaviour.py record /tmp/new
    .venv/bin/python scripts/check_same_behaviour.py compare /tmp/ref /tmp/new
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
CORA = ROOT.parent / "shared" / "data" / "planetoid_cora"
# Values the code computes; everything else in a metrics line is a time, a rate or a memory reading.
COMPUTED = ("epoch", "loss", "train_acc", "lr", "val_acc", "val_loss", "steps", "best")
GRAPHS = {
    "synthetic": ["data=synthetic"],
    "cora": ["data=planetoid", f"data.path={CORA}"],
}
TRAIN = ["train.epochs=3", "train.num_threads=2", "seed=7", "+exp=sage_2hop"]


def gnnscale(src: Path, *args: str) -> None:
    env = {**os.environ, "PYTHONPATH": str(src), "DGLBACKEND": "pytorch"}
    cmd = [sys.executable, "-c", "from gnnscale.cli import main; main()", *args]
    subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL)


def record(out: Path, src: Path) -> None:
    work = out / "work"
    shutil.rmtree(work, ignore_errors=True)
    for name, data in GRAPHS.items():
        graph = work / "graphs" / name
        gnnscale(src, "shard", f"graph_dir={graph}", f"run_dir={work / 'runs' / name / 'shard'}", *data)
        gnnscale(src, "build-csr", f"graph_dir={graph}", f"run_dir={work / 'runs' / name / 'csc'}")
        train_dir = work / "runs" / name / "train"
        gnnscale(src, "train", f"graph_dir={graph}", f"run_dir={train_dir}", *TRAIN)
        infer_dir = work / "runs" / name / "infer"
        gnnscale(src, "infer", "--layerwise", f"ckpt={train_dir}", f"run_dir={infer_dir}")
        lines = [json.loads(x) for x in (train_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]
        kept = [{k: v for k, v in rec.items() if k in COMPUTED} for rec in lines]
        (out / f"{name}_metrics.json").write_text(json.dumps(kept, indent=1))
        summary = json.loads((train_dir / "summary.json").read_text())
        (out / f"{name}_test.json").write_text(json.dumps({k: summary[k] for k in ("test_acc", "val_acc")}))
        shutil.copyfile(infer_dir / "embeddings.npy", out / f"{name}_embeddings.npy")
    shutil.rmtree(work)
    print(f"recorded {', '.join(GRAPHS)} into {out}")


def compare(ref: Path, new: Path) -> int:
    failures = []
    for name in GRAPHS:
        for what in ("metrics", "test"):
            a = json.loads((ref / f"{name}_{what}.json").read_text())
            b = json.loads((new / f"{name}_{what}.json").read_text())
            if a != b:
                failures.append(f"{name}: {what} differ\n  ref {a}\n  new {b}")
        ea, eb = np.load(ref / f"{name}_embeddings.npy"), np.load(new / f"{name}_embeddings.npy")
        diff = float(np.abs(ea - eb).max()) if ea.shape == eb.shape else float("inf")
        print(f"{name}: metrics equal: {a == b}; embeddings max abs diff {diff:.3g}")
        if diff > 1e-6:
            failures.append(f"{name}: embeddings differ by {diff:.3g} (> 1e-6)")
    for f in failures:
        print("FAIL", f)
    print("same behaviour" if not failures else f"{len(failures)} difference(s)")
    return 1 if failures else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("record")
    r.add_argument("out", type=Path)
    r.add_argument("--src", type=Path, default=ROOT, help="source tree whose gnnscale runs")
    c = sub.add_parser("compare")
    c.add_argument("ref", type=Path)
    c.add_argument("new", type=Path)
    args = ap.parse_args()
    if args.cmd == "record":
        args.out.mkdir(parents=True, exist_ok=True)
        record(args.out, args.src.resolve())
        return 0
    return compare(args.ref, args.new)


if __name__ == "__main__":
    sys.exit(main())
