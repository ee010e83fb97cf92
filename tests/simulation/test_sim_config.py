"""The new ``simulation`` keys: defaults that keep today's behaviour, and clear errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from geofl.server.config import ConfigError, RunConfig, load_config, parse_config
from geofl.server.config.simulation import check_shares

MINIMAL = "run: {name: sim}\nmodel: m:f\n"
REGIONS = """\
simulation:
  clients: 12
  regions:
    near: {share: 0.25, rtt_ms: 20, up_mbps: 50, down_mbps: 100}
    mid: {share: 0.25, rtt_ms: 80, up_mbps: 20, down_mbps: 40, jitter_ms: 2}
    far: {share: 0.5, rtt_ms: 220, up_mbps: 5, down_mbps: 10, loss: 0.01}
"""


def _load(tmp_path: Path, text: str) -> RunConfig:
    path = tmp_path / "run.yaml"
    path.write_text(MINIMAL + text)
    return load_config(path)


def _error(tmp_path: Path, text: str) -> str:
    path = tmp_path / "run.yaml"
    path.write_text(MINIMAL + text)
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    return str(caught.value)


def test_defaults_change_nothing() -> None:
    sim = parse_config({"run": {"name": "x"}, "model": "m:f"}).simulation
    assert (sim.regions, sim.trace, sim.partition) == ({}, None, None)
    assert (sim.clock, sim.backend) == ("wall", "process")
    assert sim.heterogeneity.compute.constant is not None
    assert sim.heterogeneity.bandwidth.constant is not None
    assert sim.compute.samples_per_s == 200.0


def test_a_full_simulation_section_loads(tmp_path: Path) -> None:
    (tmp_path / "traces").mkdir()
    (tmp_path / "traces" / "t.json").write_text(json.dumps({}))
    config = _load(
        tmp_path,
        REGIONS
        + "  heterogeneity:\n    compute: {lognormal: {sigma: 0.5}}\n    bandwidth: constant\n"
        "  compute: {samples_per_s: 80}\n  trace: traces/t.json\n"
        "  partition: {by_region: {alpha: 0.3}}\n  clock: wall\n  backend: process\n",
    )
    sim = config.simulation
    assert list(sim.regions) == ["near", "mid", "far"]
    assert sim.regions["far"].loss == 0.01 and sim.regions["mid"].jitter_ms == 2
    assert sim.heterogeneity.compute.lognormal is not None
    assert sim.heterogeneity.compute.lognormal.sigma == 0.5
    assert sim.trace == tmp_path / "traces" / "t.json"  # relative to the YAML file
    assert sim.partition is not None and sim.partition.scheme == "by_region"
    stored = config.to_dict()["simulation"]
    assert stored["partition"]["by_region"] == {"alpha": 0.3}


@pytest.mark.parametrize(
    ("section", "message"),
    [
        (
            "simulation: {regions: {a: {share: 0.3, rtt_ms: 1, up_mbps: 1, down_mbps: 1}, "
            "b: {share: 0.6, rtt_ms: 1, up_mbps: 1, down_mbps: 1}}}",
            "simulation.regions: region shares must sum to 1, got a=0.3, b=0.6 (sum 0.9)",
        ),
        (
            "simulation: {regions: {a: {share: 1, rtt: 1, up_mbps: 1, down_mbps: 1}}}",
            "simulation.regions.a.rtt",
        ),
        (
            "simulation: {regions: {a: {share: 1, rtt_ms: 1, up_mbps: 1, down_mbps: 1, loss: 1}}}",
            "simulation.regions.a.loss",
        ),
        (
            "simulation: {regions: {a: {share: 0, rtt_ms: 1, up_mbps: 1, down_mbps: 1}}}",
            "simulation.regions.a.share",
        ),
        (
            "simulation: {regions: {'a b': {share: 1, rtt_ms: 1, up_mbps: 1, down_mbps: 1}}}",
            "region names must be",
        ),
        ("simulation: {backend: ray}", "backend: ray runs virtual clients; set clock: virtual"),
        ("simulation: {relay: {cohort: 0}}", "simulation.relay.cohort"),
        ("simulation: {workers: -1}", "simulation.workers"),
        ("simulation: {target_accuracy: 1.5}", "simulation.target_accuracy"),
        ("simulation: {clock: sundial}", "simulation.clock"),
        (
            "simulation: {partition: {iid: {}, shards: {per_client: 2}}}",
            "partition takes exactly one of iid, dirichlet, shards, by_region; got iid, shards",
        ),
        ("simulation: {partition: {}}", "got none"),
        (
            "simulation: {partition: {dirichlet: {alpha: 0}}}",
            "simulation.partition.dirichlet.alpha",
        ),
        (
            "simulation: {partition: {shards: {per_client: 0}}}",
            "simulation.partition.shards.per_client",
        ),
        (
            "simulation: {partition: {by_region: {alpha: 1}}}",
            "partition.by_region splits the data by region, but simulation.regions is empty",
        ),
        (
            "simulation: {heterogeneity: {compute: {uniform: {low: 2, high: 1}}}}",
            "low (2.0) must not exceed high (1.0)",
        ),
        (
            "simulation: {heterogeneity: {compute: {lognormal: {sigma: 1}, constant: {}}}}",
            "a distribution takes exactly one of lognormal, uniform, constant",
        ),
        ("simulation: {heterogeneity: {compute: gaussian}}", "simulation.heterogeneity.compute"),
        ("simulation: {compute: {samples_per_s: 0}}", "simulation.compute.samples_per_s"),
        ("simulation: {trace: missing.json}", "file not found"),
    ],
)
def test_bad_values_are_clear_errors(tmp_path: Path, section: str, message: str) -> None:
    assert message in _error(tmp_path, section + "\n")


def test_bare_words_and_empty_mappings(tmp_path: Path) -> None:
    config = _load(
        tmp_path, "simulation:\n  partition: iid\n  heterogeneity:\n    compute:\n      constant:\n"
    )
    assert config.simulation.partition is not None
    assert config.simulation.partition.iid is not None
    assert config.simulation.heterogeneity.compute.constant is not None
    other = _load(tmp_path, "simulation:\n  partition:\n    iid:\n")
    assert other.simulation.partition is not None and other.simulation.partition.scheme == "iid"


def test_a_pickled_trace_is_refused_with_the_conversion_command(tmp_path: Path) -> None:
    (tmp_path / "client_behave_trace").write_bytes(b"\x80\x04")
    message = _error(tmp_path, "simulation: {trace: client_behave_trace}\n")
    assert "geofl never unpickles" in message
    assert "python -m geofl.server.simulation.traces convert" in message


def test_shares_within_tolerance_pass() -> None:
    check_shares({"a": 1 / 3, "b": 1 / 3, "c": 1 / 3})
    check_shares({"a": 0.5, "b": 0.5000005})
    check_shares({})
    with pytest.raises(ValueError, match=r"sum 1\.00001"):
        check_shares({"a": 0.5, "b": 0.50001})
