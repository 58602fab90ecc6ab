"""The xfuser patch set's life cycle against the real xfuser 0.7.0, in fresh interpreters.

CPU mode is enabled first in every script (xfuser does not import on CPU without it); its own
changes are not TokenRing's and are left out of the snapshot. With TOKENRING_XDIT_AUTOPATCH=0
nothing is patched at import, so the snapshot taken right after `import xfuser` is xDiT as
released: install() must change every point of the table, install() again nothing more, and
uninstall() must put back the very objects (by identity). Version gating: an xfuser outside the
patch set's versions stays importable and entirely unpatched, or fails its import when strict.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from tests.speed import scaled
from tests.xdit.launches import CPU_MODE_MARKS
from tokenring_xdit.patches.table import AUTOMATIC, PATCH_TABLE

pytestmark = CPU_MODE_MARKS

XFUSER_IDS = [p.id for p in PATCH_TABLE if p.host == "xfuser" and p.switch == AUTOMATIC]
YUNCHANG_IDS = [p.id for p in PATCH_TABLE if p.host == "yunchang"]
# xfuser imports diffusers' models, so install() patches diffusers too (its own, independent set)
DIFFUSERS_IDS = [p.id for p in PATCH_TABLE if p.id.startswith("diffusers.")]

PRELUDE = textwrap.dedent(
    """
    import json, sys
    from tokenring_xdit.patches import xfuser_cpu
    xfuser_cpu.enable()

    ARGS_METHODS = ("add_cli_args", "add_runner_args", "from_cli_args", "from_runner_args")

    def snapshot():
        import yunchang, yunchang.globals as g, yunchang.hybrid.utils as u
        import yunchang.comm.extract_local as e, yunchang.hybrid.attn_layer as a
        import yunchang.ring.utils as ru
        import xfuser.config.args as args_module
        import xfuser.core.long_ctx_attention.hybrid.attn_layer as lc
        import xfuser.model_executor.layers.usp as usp
        import xfuser.model_executor.pipelines.base_pipeline as bp
        cls = lc.xFuserLongContextAttention
        return {
            "convert_transformer": id(
                vars(bp.xFuserPipelineBaseWrapper)["_convert_transformer_backbone"]),
            "usp.ring_attn": id(vars(usp)["ring_attn"]),
            "xFuserArgs": {m: id(vars(args_module.xFuserArgs)[m]) for m in ARGS_METHODS},
            "long_ctx.__init__": id(vars(cls)["__init__"]),
            "kv_cache_list": [id(cls.ring_impl_type_supported_kv_cache),
                              list(cls.ring_impl_type_supported_kv_cache)],
            "yunchang.ring": {k: id(v) for k, v in u.RING_IMPL_DICT.items()},
            "yunchang.packed": {k: id(v) for k, v in u.RING_IMPL_QKVPACKED_DICT.items()},
            "yunchang.extract": {k: id(v) for k, v in e.EXTRACT_FUNC_DICT.items()},
            "yunchang.set_pg": [id(g.set_seq_parallel_pg), id(yunchang.set_seq_parallel_pg)],
            "yunchang.init": [id(vars(a.LongContextAttention)["__init__"]),
                              id(vars(a.LongContextAttentionQKVPacked)["__init__"])],
            "yunchang.update_npu_out": hasattr(ru, "update_npu_out"),
        }

    def has_flag():
        from xfuser import xFuserArgs
        from xfuser.config import FlexibleArgumentParser
        return "--ring_impl_type" in xFuserArgs.add_cli_args(
            FlexibleArgumentParser())._option_string_actions

    def host_ids():
        # installed_patches() lists CPU mode's rows too (this prelude enables it)
        import tokenring_xdit
        return [i for i in tokenring_xdit.installed_patches()
                if not i.startswith(("xfuser_cpu.", "diffusers_cpu."))]

    def ring_attn_is_xdits():
        import xfuser.model_executor.layers.usp as usp
        fn = vars(usp)["ring_attn"]
        return (type(fn).__name__ == "function" and fn.__module__ == usp.__name__
                and not hasattr(fn, "__wrapped__"))
    """
)


def run_py(code: str, **env: str) -> tuple[int, dict | None, str]:
    """Run PRELUDE + code in a new interpreter; its last stdout line is a JSON object."""
    full_env = {**os.environ, "OMP_NUM_THREADS": "1", **env}
    proc = subprocess.run(
        [sys.executable, "-c", PRELUDE + textwrap.dedent(code)],
        capture_output=True,
        text=True,
        env=full_env,
        timeout=scaled(180),
    )
    lines = proc.stdout.strip().splitlines()
    report = json.loads(lines[-1]) if proc.returncode == 0 and lines else None
    return proc.returncode, report, proc.stderr


LIFE_CYCLE = """
    import xfuser  # noqa: F401
    import tokenring_xdit
    report = {"applied_before": host_ids(), "before": snapshot(),
              "flag_before": has_flag(), "xdit_ring_before": ring_attn_is_xdits()}
    tokenring_xdit.install()
    report["first"] = host_ids()
    report["once"] = snapshot()
    report["flag_installed"] = has_flag()
    tokenring_xdit.install()
    report["second"] = host_ids()
    report["twice"] = snapshot()
    tokenring_xdit.uninstall()
    report["after"] = snapshot()
    report["applied_after"] = tokenring_xdit.installed_patches()  # CPU mode's rows too
    report["flag_after"] = has_flag()
    report["xdit_ring_after"] = ring_attn_is_xdits()
    tokenring_xdit.uninstall()
    report["after_twice"] = snapshot()
    tokenring_xdit.install()
    report["again"] = host_ids()
    report["flag_again"] = has_flag()
    report["again_snapshot_matches_once"] = {
        k: snapshot()[k] == report["once"][k] for k in report["once"]}
    tokenring_xdit.uninstall()
    print(json.dumps(report))
"""


@pytest.fixture(scope="module")
def life_cycle() -> dict:
    code, report, stderr = run_py(LIFE_CYCLE, TOKENRING_XDIT_AUTOPATCH="0")
    assert code == 0, stderr[-4000:]
    return report


def test_nothing_patched_before_install(life_cycle) -> None:
    assert life_cycle["applied_before"] == []
    assert life_cycle["flag_before"] is False
    assert life_cycle["xdit_ring_before"] is True
    assert "token_ring" not in life_cycle["before"]["kv_cache_list"][1]


def test_install_changes_every_xfuser_point(life_cycle) -> None:
    before, once = life_cycle["before"], life_cycle["once"]
    assert set(XFUSER_IDS) <= set(life_cycle["first"]), life_cycle["first"]
    assert life_cycle["first"] == YUNCHANG_IDS + XFUSER_IDS + DIFFUSERS_IDS
    assert once["usp.ring_attn"] != before["usp.ring_attn"]
    for method in ("add_cli_args", "add_runner_args", "from_cli_args", "from_runner_args"):
        assert once["xFuserArgs"][method] != before["xFuserArgs"][method], method
    assert once["long_ctx.__init__"] != before["long_ctx.__init__"]
    # the same list object, one more entry
    assert once["kv_cache_list"] == [before["kv_cache_list"][0], ["basic", "token_ring"]]
    assert life_cycle["flag_installed"] is True
    # yunchang's own rings are the same objects under the patch
    for key, ident in before["yunchang.ring"].items():
        assert once["yunchang.ring"][key] == ident


def test_install_twice_is_install_once(life_cycle) -> None:
    assert life_cycle["second"] == life_cycle["first"]
    assert life_cycle["twice"] == life_cycle["once"]


def test_uninstall_restores_every_symbol_by_identity(life_cycle) -> None:
    before = life_cycle["before"]
    diff = [k for k in before if life_cycle["after"][k] != before[k]]
    assert diff == [], {k: (before[k], life_cycle["after"][k]) for k in diff}
    assert life_cycle["after_twice"] == before
    assert life_cycle["applied_after"] == []
    assert life_cycle["xdit_ring_after"] is True  # usp.ring_attn is xDiT's own function again
    assert life_cycle["flag_after"] is False  # add_cli_args builds no --ring_impl_type


def test_install_after_uninstall_works_again(life_cycle) -> None:
    assert life_cycle["again"] == life_cycle["first"]
    assert life_cycle["flag_again"] is True
    changed = life_cycle["again_snapshot_matches_once"]
    # the list (same object, same contents) and the added yunchang name are as the first time
    assert changed["kv_cache_list"] and changed["yunchang.update_npu_out"]


GATED = """
    import tokenring_xdit.patches.xfuser as p
    assert "xfuser" not in sys.modules
    p.PATCHES.versions = "<0.0.1"  # as if the installed xfuser were unknown to us
    import xfuser  # noqa: F401
    import xfuser.core.long_ctx_attention.hybrid.attn_layer as lc
    import tokenring_xdit
    cls = lc.xFuserLongContextAttention
    print(json.dumps({
        "applied": p.PATCHES.applied,
        # diffusers' set is independent of these; CPU mode's rows come from the prelude
        "installed": [i for i in host_ids() if "diffusers" not in i],
        "xdit_ring": ring_attn_is_xdits(),
        "flag": has_flag(),
        "kv_cache_list": list(cls.ring_impl_type_supported_kv_cache),
        "init_wrapped": hasattr(vars(cls)["__init__"], "__wrapped__"),
        "args_wrapped": [hasattr(getattr(xfuser.xFuserArgs, m), "__wrapped__")
                         for m in ARGS_METHODS],
    }))
"""


def test_unsupported_xfuser_version_stays_importable_and_unpatched() -> None:
    code, report, stderr = run_py(GATED, TOKENRING_XDIT_AUTOPATCH="1", TOKENRING_XDIT_STRICT="0")
    assert code == 0, stderr[-4000:]
    assert report == dict(
        applied=[],
        installed=YUNCHANG_IDS,  # yunchang's version is supported: patched as usual
        xdit_ring=True,
        flag=False,
        kv_cache_list=["basic"],
        init_wrapped=False,
        args_wrapped=[False] * 4,
    )
    # the hook logs why (a warning on logger "tokenring_xdit") instead of breaking the import
    assert "xfuser left unpatched: xfuser 0.7.0 is not a version" in stderr, stderr[-2000:]


def test_unsupported_xfuser_version_fails_the_import_when_strict() -> None:
    code, report, stderr = run_py(GATED, TOKENRING_XDIT_AUTOPATCH="1", TOKENRING_XDIT_STRICT="1")
    assert code != 0 and report is None
    assert "UnsupportedHostVersion" in stderr, stderr[-3000:]
    assert "is not a version tokenring_xdit supports" in stderr


YUNCHANG_GATED = """
    import tokenring_xdit.patches.yunchang as y
    y.PATCHES.versions = "<0.0.1"  # as if the installed yunchang were unknown to us
    import xfuser  # noqa: F401
    import tokenring_xdit
    print(json.dumps({
        # diffusers' set is independent of these; CPU mode's rows come from the prelude
        "installed": [i for i in host_ids() if "diffusers" not in i],
        "xdit_ring": ring_attn_is_xdits(),
        "flag": has_flag(),
    }))
"""


def test_unsupported_yunchang_version_leaves_xfuser_unpatched_too() -> None:
    """xfuser's patch set builds on yunchang's (TokenRing's return communicators are created by
    the wrapped set_seq_parallel_pg, ring_impl_type="token_ring" lives in yunchang's registry).
    When yunchang's set is refused, xfuser's must not offer a TokenRing that cannot run.

    Fails today (see the report): xfuser is patched alone, `--ring_impl_type token_ring` is
    accepted, and then `xFuserLongContextAttention(ring_impl_type="token_ring")` dies of a bare
    KeyError 'token_ring' and USP's ring of "TokenRing has no return communicator".
    """
    code, report, stderr = run_py(
        YUNCHANG_GATED, TOKENRING_XDIT_AUTOPATCH="1", TOKENRING_XDIT_STRICT="0"
    )
    assert code == 0, stderr[-4000:]
    assert "yunchang left unpatched" in stderr, stderr[-2000:]
    assert report == dict(installed=[], xdit_ring=True, flag=False), report
