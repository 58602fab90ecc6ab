"""RingConfig reads our variables strictly: booleans both ways, unknown values named."""

from __future__ import annotations

import pytest

from tokenring_xdit.config import ENV, RingConfig


def _env(field: str, value: str) -> dict:
    return {ENV[field][0]: value}


@pytest.mark.parametrize("text,want", [("1", True), ("true", True), ("On", True), ("yes", True),
                                       ("0", False), ("false", False), ("OFF", False),
                                       ("no", False), ("", False)])  # fmt: skip
def test_strict_parses_both_ways(text, want):
    assert RingConfig.from_env(_env("strict", text)).strict is want


@pytest.mark.parametrize("field", ["cuda_graphs", "fused_merge", "autopatch", "strict"])
def test_false_switches_a_default_on_flag_off(field):
    assert getattr(RingConfig.from_env(_env(field, "false")), field) is False


@pytest.mark.parametrize(
    "field,value,allowed",
    [
        ("strict", "maybe", "1, true, yes, on, 0, false, no, off"),
        ("cuda_graphs", "2", "1, true"),
        ("ring_impl", "tokenring", "default, token_ring, auto"),
        ("validate", "sometimes", "auto, always, signature"),
        ("fabric", "nvlnk", "nvswitch, nvlink-pair, pcie, p2p-off, ib"),
        ("timeout", "-3", "positive number of seconds"),
        ("timeout", "soon", "positive number of seconds"),
    ],
)
def test_unknown_values_name_the_allowed_ones(field, value, allowed):
    with pytest.raises(ValueError) as err:
        RingConfig.from_env(_env(field, value))
    assert ENV[field][0] in str(err.value) and allowed in str(err.value), str(err.value)


def test_values_that_parse():
    cfg = RingConfig.from_env(
        {**_env("timeout", "7.5"), **_env("fabric", "NVLink"), **_env("validate", "Always")}
    )
    assert (cfg.timeout, cfg.fabric, cfg.validate) == (7.5, "nvswitch", "always")
    assert RingConfig.from_env({}) == RingConfig()
