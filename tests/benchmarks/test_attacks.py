"""The attack harness: each attack's transformation, the client apps, the run files, and
one tiny end-to-end matrix where the scaling attack breaks FedAvg but not the median."""

from __future__ import annotations

import json
import os
from pathlib import Path
from statistics import NormalDist

import numpy as np
import pytest
import torch
import yaml

from benchmarks.apps.attackers import (
    AlieClient,
    AttackConfigError,
    AttackSettings,
    FreeRiderClient,
    LabelFlipClient,
    ModelPoisoningClient,
    alie_update,
    baruch_z,
    client_app,
    flip_labels,
    free_ride,
    scaled_update,
)
from benchmarks.attacks import (
    BenchSpec,
    attack_node_config,
    load_spec,
    malicious_ids,
    matrix_run_config,
    render_matrix,
    run_matrix,
    summarize_case,
)
from geofl.client.app import ClientContext
from geofl.protocols.types import Config, Weights, WeightsView
from geofl.server.config import load_config

FMNIST_DIR = Path(os.environ.get("GEOFL_FMNIST_DIR", "/usr/share/datasets/fashion-mnist"))
needs_fmnist = pytest.mark.skipif(
    not (FMNIST_DIR / "train-images-idx3-ubyte.gz").is_file(),
    reason="Fashion-MNIST files absent: apt-get install dataset-fashion-mnist",
)

GLOBAL: Weights = {
    "w": np.array([1.0, 2.0, 3.0], dtype=np.float32),
    "n": np.array([5], dtype=np.int64),
}
HONEST: Weights = {
    "w": np.array([1.5, 1.0, 3.0], dtype=np.float32),
    "n": np.array([6], dtype=np.int64),
}


def test_scaling_multiplies_the_honest_delta_and_keeps_integer_tensors() -> None:
    out = scaled_update(GLOBAL, HONEST, 10.0)
    np.testing.assert_allclose(out["w"], [6.0, -8.0, 3.0])
    assert out["w"].dtype == np.float32
    np.testing.assert_array_equal(out["n"], [6])


def test_sign_flip_negates_the_honest_delta() -> None:
    out = scaled_update(GLOBAL, HONEST, -1.0)
    np.testing.assert_allclose(out["w"] - GLOBAL["w"], -(HONEST["w"] - GLOBAL["w"]))


def test_alie_is_mean_plus_z_std_of_the_colluders_deltas() -> None:
    colluders: list[WeightsView] = [
        {"w": np.array([2.0, 2.0, 3.0], dtype=np.float32), "n": np.array([6])},
        {"w": np.array([0.0, 4.0, 3.0], dtype=np.float32), "n": np.array([6])},
    ]
    out = alie_update(GLOBAL, colluders, 1.5)
    # deltas (1, 0, 0) and (-1, 2, 0): mean (0, 1, 0), population std (1, 1, 0)
    np.testing.assert_allclose(out["w"], [1.0 + 1.5, 2.0 + 1.0 + 1.5, 3.0])
    with pytest.raises(AttackConfigError):
        alie_update(GLOBAL, [], 1.0)


def test_baruch_z_max_for_twenty_workers_four_malicious() -> None:
    # s = floor(20/2 + 1) - 4 = 7 supporters needed; z = Phi^-1((20 - 7) / 20)
    assert baruch_z(20, 4) == pytest.approx(NormalDist().inv_cdf(0.65))
    assert baruch_z(20, 4) == pytest.approx(0.3853, abs=1e-4)
    with pytest.raises(AttackConfigError):
        baruch_z(20, 0)


def test_free_riding_sends_the_global_model_back_as_a_copy() -> None:
    out = free_ride(GLOBAL)
    np.testing.assert_array_equal(out["w"], GLOBAL["w"])
    assert out["w"] is not GLOBAL["w"]


def test_label_flip_swaps_first_and_last_classes() -> None:
    assert flip_labels(torch.tensor([0, 9, 3])).tolist() == [9, 0, 6]


@pytest.mark.parametrize(
    ("node_config", "message"),
    [
        ({"attack": "teleport"}, "attack must be one of"),
        ({"attack": "scaled"}, "needs malicious-ids"),
        ({"attack": "scaled", "malicious-ids": "1,x"}, "comma-separated partition ids"),
        ({"attack": "alie", "malicious-ids": "1"}, "needs attack-z"),
        ({"attack": "free_rider", "malicious-ids": "1", "attack-claim-factor": 0}, "> 0"),
        ({"attack": "scaled", "malicious-ids": "1", "attack-scale": "big"}, "must be a number"),
    ],
)
def test_bad_attack_settings_are_named(node_config: dict[str, object], message: str) -> None:
    with pytest.raises(AttackConfigError, match=message):
        AttackSettings.from_node_config(node_config)  # type: ignore[arg-type]


def _context(partition: int, **node_config: object) -> ClientContext:
    config = {"partition-id": partition, "num-partitions": 10, "max-train-samples": 200}
    return ClientContext(partition, f"sim-{partition}", node_config={**config, **node_config})  # type: ignore[dict-item]


ROUND: Config = {"local_steps": 3, "batch_size": 8, "lr": 0.05, "server_round": 1}


@needs_fmnist
def test_the_app_gives_each_attack_its_client_and_honest_ones_stay_honest() -> None:
    from examples.fashion_mnist.task import MLPClient, make_mlp_model

    kinds = {
        "scaled": ModelPoisoningClient,
        "sign_flip": ModelPoisoningClient,
        "label_flip": LabelFlipClient,
        "free_rider": FreeRiderClient,
        "alie": AlieClient,
    }
    for attack, kind in kinds.items():
        settings = {"attack": attack, "malicious-ids": "1,2", "attack-z": 1.0}
        assert type(client_app(_context(0, **settings))) is MLPClient
        assert type(client_app(_context(1, **settings))) is kind
    model = make_mlp_model()
    honest, honest_n, _ = client_app(_context(1)).fit(dict(model), ROUND)
    flipped = client_app(_context(1, attack="sign_flip", **{"malicious-ids": "1"}))
    sent, sent_n, _ = flipped.fit(dict(model), ROUND)
    assert sent_n == honest_n
    for name in model:
        np.testing.assert_allclose(
            sent[name] - model[name], -(honest[name] - model[name]), atol=1e-6
        )


@needs_fmnist
def test_label_flip_trains_on_flipped_labels_only() -> None:
    from examples.fashion_mnist.task import make_mlp_model

    model = make_mlp_model()
    honest = client_app(_context(3))
    flipper = client_app(_context(3, attack="label_flip", **{"malicious-ids": "3"}))
    honest_w, _, _ = honest.fit(dict(model), ROUND)
    flipped_w, _, _ = flipper.fit(dict(model), ROUND)
    assert isinstance(flipper, LabelFlipClient)
    batches = list(flipper.train_loader)
    raw = list(honest.train_loader)  # type: ignore[attr-defined]
    for (x, y), (hx, hy) in zip(batches, raw, strict=True):
        assert torch.equal(x, hx) and torch.equal(y, 9 - hy)
    assert not np.allclose(flipped_w["1.weight"], honest_w["1.weight"])


@needs_fmnist
def test_alie_colluders_send_one_vector_from_their_pooled_honest_updates() -> None:
    from examples.fashion_mnist.task import make_mlp_model

    model = make_mlp_model()
    settings = {"attack": "alie", "malicious-ids": "2,5,7", "attack-z": 0.5}
    sent = [client_app(_context(i, **settings)).fit(dict(model), ROUND)[0] for i in (2, 7)]
    honest = [dict(client_app(_context(i)).fit(dict(model), ROUND)[0]) for i in (2, 5, 7)]
    expected = alie_update(model, honest, 0.5)
    for name in model:
        np.testing.assert_array_equal(sent[0][name], sent[1][name])
        np.testing.assert_allclose(sent[0][name], expected[name], atol=1e-6)


@needs_fmnist
def test_a_free_rider_claims_its_share_and_changes_nothing() -> None:
    from examples.fashion_mnist.task import make_mlp_model

    model = make_mlp_model()
    rider = client_app(_context(4, attack="free_rider", **{"malicious-ids": "4"}))
    sent, claimed, metrics = rider.fit(dict(model), ROUND)
    assert claimed == client_app(_context(4)).fit(dict(model), ROUND)[1]
    assert metrics["samples_trained"] == 24
    for name in model:
        np.testing.assert_array_equal(sent[name], model[name])


# ---------------------------------------------------------------- the harness


def test_every_case_of_the_shipped_spec_is_a_valid_geofl_run(tmp_path: Path) -> None:
    spec = load_spec()
    ids = malicious_ids(spec.workload)
    assert len(ids) == 20 and len(set(ids)) == 20 and max(ids) < 100
    for attack in spec.attacks:
        for rule in spec.rules:
            path = tmp_path / f"{attack}-{rule}.yaml"
            path.write_text(yaml.safe_dump(matrix_run_config(spec, attack, rule, tmp_path)))
            config = load_config(path)
            assert config.strategy.clients_per_round == 20
    alie = attack_node_config(spec.workload, spec.attacks["alie"])
    assert alie["attack-z"] == pytest.approx(baruch_z(20, 4))


def test_the_summary_counts_what_happened_to_the_malicious_clients() -> None:
    result = {
        "status": "completed",
        "rounds": [
            {"round": 1, "status": "committed", "accuracy": 0.5},
            {"round": 2, "status": "committed", "accuracy": 0.7},
            {"round": 3, "status": "failed: 0 of 2", "accuracy": None},
        ],
        "participations": [
            {"node_name": "sim-3", "status": "rejected", "reason": "krum: not selected"},
            {"node_name": "sim-4", "status": "ok", "reason": None},
            {"node_name": "sim-9", "status": "ok", "reason": None},
        ],
    }
    summary = summarize_case(result, [3, 4])
    assert summary["final_accuracy"] == 0.7  # the failed round left the model as it was
    assert summary["failed_rounds"] == 1
    assert (summary["malicious_selected"], summary["malicious_used"]) == (2, 1)
    assert summary["malicious_with_reason"] == 1


def test_the_report_says_which_targets_are_missed() -> None:
    cases = [
        {"attack": "none", "rule": "fedavg", "final_accuracy": 0.80},
        {"attack": "scaled", "rule": "fedavg", "final_accuracy": 0.10},
        {"attack": "scaled", "rule": "median", "final_accuracy": 0.79},
        {"attack": "scaled", "rule": "flower_median", "final_accuracy": 0.795},
        {"attack": "alie", "rule": "fedavg", "final_accuracy": 0.70},
        {"attack": "alie", "rule": "median", "final_accuracy": 0.75},
        {"attack": "alie", "rule": "flower_median", "final_accuracy": 0.74},
    ]
    table = render_matrix({"cases": cases})
    assert "| scaled | median 0.7900 | flower_median 0.7950 | **met** | **missed** |" in table
    assert "| alie | median 0.7500 | flower_median 0.7400 | **missed** | **met** |" in table


TINY = {
    "workload": {
        "clients": 10,
        "per_round": 10,
        "rounds": 2,
        "seed": 3,
        "dirichlet_alpha": 100.0,
        "malicious_share": 0.2,
        "byzantine": 2,
        "round_config": {"local_steps": 10, "batch_size": 16, "lr": 0.05},
        "max_train_samples": 300,
    },
    "attacks": {"none": {"attack": "none"}, "scaled": {"attack": "scaled", "scale": 1000}},
    "rules": {
        "fedavg": {"name": "fedavg"},
        "median": {"name": "fedavg", "robust": {"name": "median", "byzantine": 2}},
    },
}


@needs_fmnist
def test_end_to_end_scaling_breaks_fedavg_and_not_the_median(tmp_path: Path) -> None:
    spec = BenchSpec.model_validate(TINY)
    out = tmp_path / "matrix.json"
    report = run_matrix(spec, ["scaled"], ["fedavg", "median"], out, ["--matrix"])
    acc = {(c["attack"], c["rule"]): c for c in report["cases"]}
    assert all(c["status"] == "completed" for c in acc.values()), report["cases"]
    clean = acc[("none", "fedavg")]["final_accuracy"]
    assert clean > 0.5
    assert acc[("scaled", "fedavg")]["final_accuracy"] < 0.3
    assert acc[("scaled", "median")]["final_accuracy"] > clean - 0.1
    assert acc[("scaled", "median")]["malicious_selected"] == 2 * 2  # both, both rounds
    assert json.loads(out.read_text())["malicious_ids"] == malicious_ids(spec.workload)
