"""profile.measure: timed training steps whose parts add up, rates that agree with their counts, the
bounds, the plan's prediction arithmetic, the doubling test, the trace and the micro-measurements."""

from __future__ import annotations

import json

import pytest
import torch

from gnnscale.profile import cost, measure, micro, speed
from gnnscale.training.data import load_train_data
from gnnscale.training.memory_plan import BatchShape
from tests.conftest import TINY_SYNTHETIC, build_graph, compose

CPU = torch.device("cpu")
BATCH = 64


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """The tiny graph once for the module, a small GraphSAGE on it, and one measurement with a trace."""
    tmp = tmp_path_factory.mktemp("profile_measure")
    graph_dir = build_graph(tmp, *TINY_SYNTHETIC)
    cfg = compose(
        "profile", f"graph_dir={graph_dir}", "+exp=sage_2hop", f"train.batch_size={BATCH}", "model.hidden=16"
    )
    data = load_train_data(str(graph_dir))
    trace = tmp / "trace.json"
    measured = measure.measure_steps(cfg, data, CPU, num_batches=8, trace_path=trace)
    return cfg, data, measured, trace


def test_parts_add_up_to_the_step_and_rates_agree_with_counts(setup):
    _, data, m, _ = setup
    assert set(m["split_s"]) == set(measure.PARTS)
    assert m["split_s"]["transfer_s"] == 0.0  # nothing to move on the CPU
    assert all(m["split_s"][p] > 0 for p in ("sample_s", "gather_s", "forward_s", "backward_s", "step_s"))
    assert abs(m["parts_sum_s"] - m["step_s"]) <= 0.10 * m["step_s"]
    assert m["seeds_per_batch"] == BATCH  # full batches only
    assert m["seeds_per_s"] == pytest.approx(m["seeds_per_batch"] / m["step_s"], rel=1e-9)
    assert m["edges_per_s"] == pytest.approx(m["edges_per_batch"] / m["step_s"], rel=1e-9)
    assert m["edges_per_batch"] == pytest.approx(sum(m["shape"]["edges"]), rel=1e-3)
    assert m["shape"]["dst_rows"][-1] == BATCH  # the last layer's destinations are the seeds
    assert m["gather_bytes_per_batch"] == pytest.approx(m["input_rows_per_batch"] * data.feat_dim * 4)
    # Backward: weight gradients everywhere, input gradients past the first layer: between 2x and 3x forward.
    assert 2 * m["forward_flops_per_batch"] < m["flops_per_batch"] < 3 * m["forward_flops_per_batch"]
    assert m["peak_rss_mb"] > 0 and m["gpu_peak_allocated_mb"] is None
    shape = cost.measured_shape(m)
    # 8 -> 16 widens: projected on the destinations; 16 -> 3 narrows: on the sources (layer 0's destinations).
    assert cost.projection_shapes(shape, m["dims"]) == [
        (shape.dst_rows[0], 8, 16),
        (shape.dst_rows[0], 16, 3),
    ]


def test_trace_is_a_chrome_trace_with_the_named_parts(setup):
    *_, trace = setup
    events = json.loads(trace.read_text())["traceEvents"]
    names = {e.get("name") for e in events}
    assert len(events) > 10
    assert {"sample_s", "gather_s", "forward_s", "backward_s", "step_s"} <= names


def test_layer_flops_count_sage_mean_by_hand():
    # 64 -> 16 narrows: fc_neigh on the 100 source rows, mean over 500 edges at width 16, fc_self on 20 rows.
    assert (
        cost.layer_flops("sage", "mean", 100, 20, 500, 64, 16)
        == 2 * 100 * 64 * 16 + 500 * 16 + 2 * 20 * 64 * 16
    )
    # 16 -> 64 widens: mean at width 16, then both projections on the 20 destination rows.
    assert cost.layer_flops("sage", "mean", 100, 20, 500, 16, 64) == 500 * 16 + 2 * (2 * 20 * 16 * 64)


def test_bounds_name_the_bound_the_step_is_nearest():
    m = {"step_s": 0.012, "seeds_per_batch": 100, "gather_bytes_per_batch": 1e6, "flops_per_batch": 1e9}
    m["split_s"] = dict(zip(measure.PARTS, (0.001, 0.002, 0.0, 0.005, 0.003, 0.001), strict=True))
    b = measure.bounds(m, gather_bw=1e9, flops={"flops_per_s": 1e11})  # gather 1 ms, compute 10 ms
    assert b["gather"]["s_per_batch"] == pytest.approx(1e-3)
    assert b["compute"]["s_per_batch"] == pytest.approx(1e-2)
    assert b["compute"]["max_seeds_per_s"] == pytest.approx(1e4)
    assert b["compute"]["measured_multiple"] == pytest.approx(1.2)
    assert b["closest"] == "compute" and "closest to the compute bound" in b["summary"]
    assert b["gather"]["part_multiple"] == pytest.approx(2.0)  # the measured gather against its own bound
    assert b["compute"]["part_multiple"] == pytest.approx(0.9)  # forward + backward + step: 9 ms of 10
    flipped = measure.bounds(m, gather_bw={"bytes_per_s": 1e7}, flops=1e13)  # gather 100 ms, compute 0.1 ms
    assert flipped["closest"] == "gather"


def test_prediction_adds_sampling_gather_matmuls_and_activation_traffic():
    shape = BatchShape(input_rows=1000, dst_rows=(200, 10), edges=(2000, 100))
    dims, layers = (8, 16, 4), [(1000, 200, 2000), (200, 10, 100)]
    p = cost.predict_seeds_per_s(
        10,
        shape,
        dims,
        32,
        gather_bytes_per_s=32e6,
        flops_per_s=1e9,
        sample_s=0.002,
        norm="batch",
        dropout=0.5,
    )
    flops = cost.train_flops("sage", "mean", dims, layers)
    assert flops == 2 * cost.forward_flops("sage", "mean", dims[:2], layers[:1]) + 3 * cost.forward_flops(
        "sage", "mean", dims[1:], layers[1:]
    )
    # Layer 0: 6 + 8 + 5 + 7 passes over 200 x 16 outputs, mean over 2000 edges at width 8 (forward only);
    # layer 1 (last): 6 passes over 10 x 4, its 100 edges at width 4 forward and backward.
    traffic = 4 * (26 * 200 * 16 + 2000 * 8 + 6 * 10 * 4 + 2 * 100 * 4)
    assert p["activation_bytes_per_batch"] == traffic
    assert p["parts_s"] == pytest.approx(
        {"sample_s": 0.002, "gather_s": 1e-3, "matmul_s": flops / 1e9, "activations_s": traffic / 32e6}
    )
    assert p["seeds_per_s"] == pytest.approx(10 / sum(p["parts_s"].values()))
    on_gpu = cost.predict_seeds_per_s(10, shape, dims, 32, 32e6, 1e9, 0.002, device_type="cuda")
    assert on_gpu["parts_s"]["activations_s"] == 0.0  # device memory: left out


def test_probe_sampling_times_batches_of_the_training_loader(setup):
    cfg, data, _, _ = setup
    from gnnscale.training.build import build_samplers

    sampler = build_samplers(cfg, data)["train"][0]
    probe = speed.probe_sampling(data.g, data.splits["train"], sampler, BATCH, k=3, num_layers=2)
    assert probe.sample_s > 0 and probe.batches == 3
    assert probe.shape.dst_rows[-1] == BATCH and probe.shape.input_rows >= probe.shape.dst_rows[0]


def test_doubling_test_reports_a_ratio_and_a_verdict(setup):
    cfg, data, m, _ = setup
    d = measure.doubling_test(cfg, data, CPU, num_batches=4, at_b=m)
    assert d["batch_size"] == BATCH and d["batch_size_2x"] == 2 * BATCH
    assert d["ratio"] == pytest.approx(d["seeds_per_s_2x"] / d["seeds_per_s"])
    assert d["bound_by"] in ("per-batch", "per-seed", "mixed", "unreliable")
    assert f"batch {2 * BATCH}" in d["verdict"]


def test_micro_measurements_are_positive(setup):
    _, data, _, _ = setup
    gather = micro.gather_bandwidth(data.features, rows=200, min_run_time=0.05)
    assert gather["bytes_per_s"] > 0 and gather["row_bytes"] == data.feat_dim * 4
    assert gather["rows_per_gather"] == 200 and gather["gathers"] >= 5
    mm = micro.matmul_flops(CPU, [(128, 8, 16), (64, 16, 3)], min_run_time=0.05)
    assert mm["flops_per_s"] > 0 and [s["m"] for s in mm["shapes"]] == [128, 64]
