"""The geo_lm example: its data split, its site-held AdamW state, and its two kinds of fit.

Small and fast: batches of two windows, two or three steps. The end-to-end DiLoCo run is in
``test_geo_lm_e2e.py``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest
import torch

from examples.geo_lm import data
from examples.geo_lm.model import ByteLM, lm_loss
from examples.geo_lm.optimizer_state import StateStore
from examples.geo_lm.task import GeoLMClient, draw_batches, make_model
from geofl.protocols.lr_schedule import scheduled_lr
from geofl.protocols.types import Config, Weights
from geofl.server.strategies.adamw import AdamW

SITES = 4


def _histogram(site: int) -> npt.NDArray[np.float64]:
    counts = np.bincount(data.site_bytes(site, SITES), minlength=256).astype(np.float64)
    share: npt.NDArray[np.float64] = counts / counts.sum()
    return share


def test_split_is_deterministic_and_by_whole_packages() -> None:
    first = data.site_packages(SITES)
    data.corpus.cache_clear()
    again = data.site_packages(SITES)
    assert first == again
    owners = [name for site in first for name in site]
    assert len(owners) == len(set(owners)), "a package was given to two sites"
    assert set(owners) == set(data.corpus().packages)
    assert all(site and data.site_bytes(i, SITES).size > 100_000 for i, site in enumerate(first))


def test_split_is_non_iid() -> None:
    """Sites hold different code: their byte distributions differ measurably."""
    histograms = [_histogram(site) for site in range(SITES)]
    distances = [
        0.5 * np.abs(histograms[a] - histograms[b]).sum()
        for a in range(SITES)
        for b in range(a + 1, SITES)
    ]
    assert min(distances) > 0.005, distances


def test_held_out_files_are_disjoint_from_training() -> None:
    found = data.corpus()
    training = {f for files in found.packages.values() for f in files}
    assert found.held_out and not training.intersection(found.held_out)
    assert all(data.is_held_out(f) for f in found.held_out)
    windows = data.validation_windows(8, 128)
    assert windows.shape == (8, 129)
    assert np.array_equal(windows, data.validation_windows(8, 128))


def test_too_few_packages_for_the_sites_is_refused() -> None:
    with pytest.raises(data.CorpusError, match="fewer than the"):
        data.site_packages(10_000)


#: Warmup over the first step, cosine decay to a fifth by the fourth (of two rounds of two).
SCHEDULE: Config = {"warmup_steps": 1, "decay_steps": 4, "final_lr_ratio": 0.2}


def _fit_config(server_round: int, steps: int = 2, schedule: Config | None = None) -> Config:
    return {
        "mode": "adamw",
        "local_steps": steps,
        "batch_size": 2,
        "lr": 1e-3,
        "server_round": server_round,
        "state_tag": "test",
        **(schedule or {}),
    }


def _client(state_dir: Path, memory: dict[str, object] | None = None) -> GeoLMClient:
    path = state_dir / "site-1.adamw.safetensors"
    return GeoLMClient(1, SITES, StateStore({} if memory is None else memory, path))


def _two_rounds(first: GeoLMClient, second: GeoLMClient, schedule: Config | None = None) -> Weights:
    weights = make_model()
    after_one, _, _ = first.fit(weights, _fit_config(1, schedule=schedule))
    after_two, _, _ = second.fit(dict(after_one), _fit_config(2, schedule=schedule))
    return dict(after_two)


def _continuous_adamw(
    client: GeoLMClient, schedule: Config | None = None
) -> dict[str, npt.NDArray[np.float32]]:
    """What two rounds of two steps must equal: one torch AdamW over the same four batches
    (with ``schedule``: under a ``LambdaLR`` stepped after every step)."""
    model = ByteLM()
    model.load_state_dict({n: torch.from_numpy(w) for n, w in make_model().items()})
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    settings = {"warmup_steps": 0, "decay_steps": 0, "final_lr_ratio": 0.1, **(schedule or {})}
    lambdas = torch.optim.lr_scheduler.LambdaLR(
        optimizer,
        lambda done: scheduled_lr(
            1.0,
            done + 1,
            int(settings["warmup_steps"]),
            int(settings["decay_steps"]),
            float(settings["final_lr_ratio"]),
        ),
    )
    for server_round in (1, 2):
        for windows in draw_batches(client.text, client.site, server_round, 0, 2, 2):
            optimizer.zero_grad()
            torch.autograd.backward(lm_loss(model, windows))
            optimizer.step()
            lambdas.step()
    return {n: t.detach().numpy() for n, t in model.state_dict().items()}


def _assert_close(found: Weights, expected: dict[str, npt.NDArray[np.float32]]) -> None:
    for name, value in expected.items():
        np.testing.assert_allclose(found[name], value, rtol=0, atol=1e-6, err_msg=name)


def test_adamw_state_survives_a_client_restart(tmp_path: Path) -> None:
    """A client rebuilt from scratch (a new process: empty memory, the state file only)
    continues its AdamW exactly: two rounds equal one optimizer's four steps, and differ
    from a second round that starts with a fresh optimizer."""
    restarted = _two_rounds(_client(tmp_path / "restart"), _client(tmp_path / "restart"))
    expected = _continuous_adamw(_client(tmp_path / "reference"))
    for name, value in expected.items():
        np.testing.assert_allclose(restarted[name], value, rtol=0, atol=1e-6, err_msg=name)
    fresh_dir = tmp_path / "reset"
    after_one, _, _ = _client(fresh_dir).fit(make_model(), _fit_config(1))
    (fresh_dir / "site-1.adamw.safetensors").unlink()  # what a lost state would do
    reset = dict(_client(fresh_dir).fit(dict(after_one), _fit_config(2))[0])
    assert any(not np.allclose(expected[n], reset[n], atol=1e-6) for n in reset)
    saved = StateStore({}, tmp_path / "restart" / "site-1.adamw.safetensors").load("test", 3)
    assert saved is not None
    assert float(saved.tensors["embed.weight.step"][0]) == 4.0


def test_adamw_state_continues_in_memory_without_a_state_dir() -> None:
    """Without ``state-dir`` the context's memory carries the state to a rebuilt client."""
    memory: dict[str, object] = {}
    first = GeoLMClient(1, SITES, StateStore(memory, None))
    rebuilt = GeoLMClient(1, SITES, StateStore(memory, None))
    continued = _two_rounds(first, rebuilt)
    expected = _continuous_adamw(first)
    for name, value in expected.items():
        np.testing.assert_allclose(continued[name], value, rtol=0, atol=1e-6, err_msg=name)


def test_scheduled_rate_follows_the_sites_step_count_across_a_restart(tmp_path: Path) -> None:
    """With warmup and cosine decay, a site restarted between rounds takes its steps at the
    rates of one continuous schedule (its step count comes back with its state), which is
    not what a schedule restarted at step 1 each round would give."""
    restarted = _two_rounds(_client(tmp_path / "a"), _client(tmp_path / "a"), SCHEDULE)
    reference = _client(tmp_path / "reference")
    _assert_close(restarted, _continuous_adamw(reference, SCHEDULE))
    unscheduled = _continuous_adamw(reference)
    assert any(not np.allclose(restarted[n], unscheduled[n], atol=1e-6) for n in unscheduled)


def test_a_schedule_that_decays_before_its_warmup_ends_is_refused() -> None:
    client = GeoLMClient(1, SITES, StateStore({}, None))
    bad: Config = {"warmup_steps": 4, "decay_steps": 4}
    with pytest.raises(ValueError, match="must exceed warmup"):
        client.fit(make_model(), _fit_config(1, schedule=bad))


@pytest.mark.parametrize("key", ["batch_size", "local_steps"])
def test_an_empty_fit_is_refused_before_it_trains(key: str) -> None:
    client = GeoLMClient(1, SITES, StateStore({}, None))
    with pytest.raises(ValueError, match=f"config\\['{key}'\\] must be an integer >= 1"):
        client.fit(make_model(), {**_fit_config(1), key: 0})


def test_state_of_another_run_is_not_used(tmp_path: Path) -> None:
    client = _client(tmp_path)
    client.fit(make_model(), _fit_config(5))
    store = StateStore({}, tmp_path / "site-1.adamw.safetensors")
    assert store.load("test", 5) is not None
    assert store.load("other-run", 6) is None
    assert store.load("test", 1) is None  # written after round 5: an earlier run's file


def test_sync_data_parallel_equals_one_process_on_the_combined_batch() -> None:
    """Gradient fits averaged and stepped by the server's AdamW give torch's AdamW on the
    four sites' batches together, step after step."""
    clients = [GeoLMClient(site, SITES, StateStore({}, None)) for site in range(SITES)]
    strategy = AdamW(server_lr=1e-3, weight_decay=0.01)
    reference = ByteLM()
    initial = make_model()
    with torch.no_grad():
        for name, tensor in reference.state_dict().items():
            tensor.copy_(torch.from_numpy(initial[name]))
    optimizer = torch.optim.AdamW(reference.parameters(), lr=1e-3, weight_decay=0.01)
    weights = dict(initial)
    for server_round in (1, 2, 3):
        config: Config = {"mode": "gradient", "batch_size": 2, "server_round": server_round}
        deltas = []
        for client in clients:
            returned, examples, _ = client.fit(dict(weights), config)
            assert examples == 2 * 128
            deltas.append(
                {
                    n: np.asarray(returned[n], np.float32) - weights[n].astype(np.float32)
                    for n in weights
                }
            )
        mean: Weights = {n: np.mean(np.stack([d[n] for d in deltas]), axis=0) for n in weights}
        weights = strategy.apply(weights, mean, server_round)
        combined = torch.cat(
            [draw_batches(client.text, client.site, server_round, 0, 1, 2)[0] for client in clients]
        )
        optimizer.zero_grad()
        torch.autograd.backward(lm_loss(reference, combined))
        optimizer.step()
    expected = {n: t.detach().numpy() for n, t in reference.state_dict().items()}
    final = {n: np.asarray(weights[n], np.float32) for n in expected}
    errors = np.concatenate([np.abs(final[n] - expected[n]).ravel() for n in expected])
    moved = max(float(np.max(np.abs(final[n] - initial[n].astype(np.float32)))) for n in expected)
    assert moved > 1e-3  # three steps of lr 1e-3 moved the weights
    # The gradients travel as float32 weights w - g, whose rounding (an ulp of w) is a large
    # share of a tiny g, and Adam normalizes tiny gradients up to steps of order lr: the
    # few coordinates with such gradients differ by up to a few percent of one step.
    assert float(np.mean(errors)) < 1e-7
    assert float(np.mean(errors > 1e-5)) < 1e-4
    assert float(np.max(errors)) < 1e-4
