"""Patch life cycle against the real yunchang, each scenario in a fresh interpreter.

Fresh interpreters matter: the `.pth` bootstrap only acts at start-up, and import hooks are
process-wide state.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from tests.speed import scaled

ALL_IDS = [
    "yunchang.ring_impl",
    "yunchang.ring_impl_qkvpacked",
    "yunchang.extract_local",
    "yunchang.set_seq_parallel_pg",
    "yunchang.ring_impl_type_check",
    "yunchang.update_npu_out",
]

# A fingerprint of every symbol the yunchang patch set may touch: object identities and keys.
SNAPSHOT = textwrap.dedent(
    """
    def snapshot():
        import yunchang, yunchang.globals as g, yunchang.hybrid.utils as u
        import yunchang.comm.extract_local as e, yunchang.hybrid.attn_layer as a
        return {
            "ring": {k: id(v) for k, v in u.RING_IMPL_DICT.items()},
            "packed": {k: id(v) for k, v in u.RING_IMPL_QKVPACKED_DICT.items()},
            "extract": {k: id(v) for k, v in e.EXTRACT_FUNC_DICT.items()},
            "attn_layer_dict_is_utils_dict": a.RING_IMPL_DICT is u.RING_IMPL_DICT,
            "set_pg": [id(g.set_seq_parallel_pg), id(yunchang.set_seq_parallel_pg)],
            "init": [id(a.LongContextAttention.__dict__["__init__"]),
                     id(a.LongContextAttentionQKVPacked.__dict__["__init__"])],
        }
    """
)


def run_py(code: str, **env: str) -> dict:
    """Run `code` in a new interpreter; it must print one JSON object as its last line."""
    full_env = {**os.environ, **env}
    proc = subprocess.run(
        [sys.executable, "-c", SNAPSHOT + textwrap.dedent(code)],
        capture_output=True,
        text=True,
        env=full_env,
        timeout=scaled(120),
    )
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_bootstrap_patches_yunchang_on_first_import():
    got = run_py(
        """
        import json, sys
        assert "yunchang" not in sys.modules
        from yunchang import LongContextAttention, EXTRACT_FUNC_DICT
        from yunchang.hybrid.utils import RING_IMPL_DICT, RING_IMPL_QKVPACKED_DICT
        import tokenring_xdit
        print(json.dumps({"applied": tokenring_xdit.installed_patches(),
                          "ring": "token_ring" in RING_IMPL_DICT,
                          "packed": "token_ring" in RING_IMPL_QKVPACKED_DICT,
                          "extract": "token_ring" in EXTRACT_FUNC_DICT}))
        """,
        TOKENRING_XDIT_AUTOPATCH="1",
    )
    assert got == {"applied": ALL_IDS, "ring": True, "packed": True, "extract": True}


def test_autopatch_off_then_install_uninstall_restores_everything():
    got = run_py(
        """
        import json
        import yunchang
        import tokenring_xdit
        before = snapshot()
        applied_before = tokenring_xdit.installed_patches()
        first = tokenring_xdit.install()
        once = snapshot()
        tokenring_xdit.install()
        twice = snapshot()
        tokenring_xdit.uninstall()
        after = snapshot()
        tokenring_xdit.uninstall()
        print(json.dumps({"applied_before": applied_before, "first": first,
                          "before": before, "once": once, "twice": twice, "after": after,
                          "after_twice": snapshot()}))
        """,
        TOKENRING_XDIT_AUTOPATCH="0",
    )
    assert got["applied_before"] == []
    assert got["first"] == ALL_IDS
    assert got["before"] == got["after"] == got["after_twice"]
    assert got["once"] == got["twice"]
    assert got["once"] != got["before"]
    # yunchang's own rings are the same objects under the patch
    for key, ident in got["before"]["ring"].items():
        assert got["once"]["ring"][key] == ident
    assert got["once"]["attn_layer_dict_is_utils_dict"]


def test_install_before_import_uses_post_import_hook():
    got = run_py(
        """
        import json
        import tokenring_xdit
        tokenring_xdit.install()
        from yunchang.hybrid.utils import RING_IMPL_DICT
        print(json.dumps({"ring": "token_ring" in RING_IMPL_DICT,
                          "applied": tokenring_xdit.installed_patches()}))
        """,
        TOKENRING_XDIT_AUTOPATCH="0",
    )
    assert got == {"ring": True, "applied": ALL_IDS}


def test_yunchang_set_applied_before_yunchang_is_imported():
    """The xfuser set applies the yunchang set first; where xfuser imported no yunchang (a CUDA
    build of torch without a GPU gates those imports on a device), that apply is yunchang's
    first import, which fires the armed hook inside it. The set must still apply once."""
    got = run_py(
        """
        import json, sys
        assert "yunchang" not in sys.modules
        from tokenring_xdit.patches import yunchang as yunchang_patches
        import tokenring_xdit
        first = yunchang_patches.apply()
        print(json.dumps({"first": first, "again": yunchang_patches.apply(),
                          "applied": tokenring_xdit.installed_patches()}))
        """,
        TOKENRING_XDIT_AUTOPATCH="1",
        TOKENRING_XDIT_STRICT="1",
    )
    # the hook applied it during the import, so this call found it applied
    assert got == {"first": False, "again": False, "applied": ALL_IDS}


def test_uninstall_before_import_keeps_hooks_from_patching():
    got = run_py(
        """
        import json
        import tokenring_xdit
        tokenring_xdit.uninstall()
        from yunchang.hybrid.utils import RING_IMPL_DICT
        print(json.dumps({"ring": "token_ring" in RING_IMPL_DICT}))
        """,
        TOKENRING_XDIT_AUTOPATCH="1",
    )
    assert got == {"ring": False}


def test_unsupported_host_version_leaves_yunchang_importable_and_unpatched():
    code = """
        import json
        import tokenring_xdit.patches.yunchang as p
        p.PATCHES.versions = "<0.0.1"   # as if the installed yunchang were unknown to us
        import yunchang
        from yunchang.hybrid.utils import RING_IMPL_DICT
        print(json.dumps({"ring": "token_ring" in RING_IMPL_DICT,
                          "applied": p.PATCHES.applied}))
        """
    got = run_py(code, TOKENRING_XDIT_AUTOPATCH="1", TOKENRING_XDIT_STRICT="0")
    assert got == {"ring": False, "applied": []}
    with pytest.raises(AssertionError, match="UnsupportedHostVersion"):
        run_py(code, TOKENRING_XDIT_AUTOPATCH="1", TOKENRING_XDIT_STRICT="1")


def test_failure_midway_rolls_back_the_whole_patch_set():
    got = run_py(
        """
        import json
        import yunchang
        from yunchang.comm.extract_local import EXTRACT_FUNC_DICT
        import tokenring_xdit
        EXTRACT_FUNC_DICT["token_ring"] = "someone else's"   # third patch point now conflicts
        before = snapshot()
        try:
            tokenring_xdit.install()
            error = None
        except RuntimeError as exc:
            error = str(exc)
        print(json.dumps({"error": error, "same": snapshot() == before,
                          "applied": tokenring_xdit.installed_patches()}))
        """,
        TOKENRING_XDIT_AUTOPATCH="0",
    )
    assert got["error"] and "already taken" in got["error"]
    assert got["same"] and got["applied"] == []


def test_python_startup_does_not_import_torch_or_hosts():
    got = run_py(
        """
        import json, sys
        print(json.dumps({m: m in sys.modules for m in
                          ("torch", "wrapt", "yunchang", "tokenring_xdit._bootstrap",
                           "importlib.metadata")}))
        """,
        TOKENRING_XDIT_AUTOPATCH="1",
    )
    assert got == {
        "torch": False,
        "wrapt": False,
        "yunchang": False,
        "tokenring_xdit._bootstrap": True,
        "importlib.metadata": False,
    }
