"""`tokenring-xdit compare` without starting ranks: settings, thresholds, the files it writes
and its exit codes, with a stand-in launcher that returns what the workers would."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from tokenring_xdit.tools import cli, compare


def _args(argv):
    return cli.build_parser().parse_args(["compare", *argv])


def _resolve(argv, gpus=0):
    return compare.resolve(_args(argv), gpus=gpus)


def test_default_is_tiny_pixart_on_two_cpu_ranks():
    cfg = _resolve([])
    assert (cfg.model, cfg.size, cfg.device, cfg.dtype) == ("pixart", "tiny", "cpu", "float32")
    assert (cfg.nproc, cfg.ulysses, cfg.ring) == (2, 1, 2)
    assert (cfg.height, cfg.width, cfg.steps, cfg.text_len) == (128, 128, 8, 16)
    assert cfg.qk_gain == compare.DEFAULT_QK_GAIN and cfg.guidance == 4.5
    t = compare.thresholds_for(_args([]), cfg.dtype)
    assert (t.psnr_min, t.max_diff, t.latent_rtol) == (60.0, 1 / 255, 1e-4)


def test_gpu_defaults():
    cfg = _resolve(["--size", "full", "--model", "flux"], gpus=2)
    assert (cfg.device, cfg.dtype, cfg.nproc, cfg.ring) == ("cuda", "bfloat16", 2, 2)
    assert (cfg.height, cfg.width, cfg.steps, cfg.text_len, cfg.guidance) == (
        1024,
        1024,
        20,
        512,
        3.5,
    )
    t = compare.thresholds_for(_args(["--psnr-min", "40"]), cfg.dtype)
    assert (t.psnr_min, t.max_diff, t.latent_rtol) == (40.0, math.inf, math.inf)


def test_ulysses_times_ring():
    cfg = _resolve(["--ulysses-degree", "2", "--ring-degree", "2"])
    assert (cfg.nproc, cfg.ulysses, cfg.ring) == (4, 2, 2)
    assert _resolve(["--nproc", "4", "--ulysses-degree", "2"]).ring == 2


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--nproc", "2", "--ulysses-degree", "2"], "no ring to compare"),
        (["--nproc", "3", "--ring-degree", "2"], "must equal --nproc"),
        (["--height", "132"], "multiple of 8"),
        (["--width", "100"], "multiple of 8"),
        (["--ring-degree", "4", "--height", "136"], "multiple of 16"),
        (["--model", "flux", "--text-len", "15"], "multiple of ulysses x ring"),
        (["--device", "cuda"], "one GPU per rank"),
        (["--dtype", "bfloat16"], "float32"),
        (["--warmup-steps", "-1"], "--warmup-steps"),
    ],
)
def test_bad_combinations(argv, message):
    with pytest.raises(ValueError, match=message):
        _resolve(argv)


@pytest.mark.parametrize("argv", [["--qk-gain", "0"], ["--nproc", "0"], ["--model", "sd3"]])
def test_bad_values_exit_2(argv, capsys):
    with pytest.raises(SystemExit) as info:
        cli.main(["compare", *argv])
    assert info.value.code == 2


def test_usage_error_exits_2_before_launching(monkeypatch, capsys):
    monkeypatch.setattr("tokenring_xdit.tools.launch.launch", _no_launch)
    assert cli.main(["compare", "--height", "130"]) == compare.EXIT_USAGE
    assert "multiple of 8" in capsys.readouterr().err


def _no_launch(*args, **kwargs):
    raise AssertionError("ranks started")


def _image(seed: int = 0, size: int = 16):
    return np.random.default_rng(seed).uniform(0.1, 0.9, (size, size, 3)).astype(np.float32)


def _fake_launcher(image_noise=None, wrong_path=False):
    """Returns, per rank, what single_worker / xdit_worker return: the image on the last rank,
    latents split by rows, step times, ring-call counts."""
    latents = np.random.default_rng(1).normal(size=(1, 4, 8, 8)).astype(np.float32)

    def launcher(worker, nproc, args, *, device, timeout, env, on_progress):
        impl = args[1] if len(args) > 1 else None
        on_progress(nproc - 1, dict(description="denoising", total=3, completed=3))
        image = _image()
        if impl == "token_ring" and image_noise is not None:
            image = image + image_noise
        parts = np.split(latents, nproc, axis=-2)
        values = []
        for rank in range(nproc):
            calls = {}
            if impl is not None:
                token = impl == "token_ring"
                calls = {"token_ring": 4 * token, "xdit_ring": 4 * (not token)}
                if wrong_path and token:
                    calls = {"token_ring": 0, "xdit_ring": 4}
            value = dict(
                rank=rank,
                ranks=nproc,
                step_s=[0.01, 0.02, 0.01],
                total_s=0.05,
                image=image if rank == nproc - 1 else None,
                latents=parts[rank],
                ring_calls=calls,
                threads_per_rank=1,
            )
            if impl is not None:
                value.update(ring_impl=[impl, "--ring_impl_type"], attention_backend="SDPA_FLASH")
            values.append(value)
        return values

    return launcher


def _run(tmp_path, **fake):
    cfg = compare.CompareConfig(height=16, width=16, steps=3)
    thresholds = compare.Thresholds(*compare.DEFAULT_THRESHOLDS["float32"])
    return compare.run_compare(
        cfg, thresholds, str(tmp_path), quiet=True, launcher=_fake_launcher(**fake)
    )


def test_identical_images_pass_and_every_file_is_written(tmp_path):
    report = _run(tmp_path)
    assert report["passed"] and report["path_problems"] == []
    files = report["files"]
    assert set(files) == {"single", "ring", "token_ring", "figure", "report"}
    for name in files.values():
        assert (tmp_path / name).is_file()
    saved = json.loads((tmp_path / files["report"]).read_text())
    first = saved["comparisons"][0]
    assert (first["test"], first["reference"], first["checked"]) == ("token_ring", "ring", True)
    assert first["psnr_db"] == "inf" and first["max_abs_diff"] == 0.0  # JSON has no infinity
    assert saved["command"].startswith("tokenring-xdit compare --model pixart --size tiny")
    assert saved["runs"]["ring"]["s_per_step"] == pytest.approx(0.01)  # median
    assert saved["versions"]["xfuser"] and saved["thresholds"]["psnr_min"] == 60.0
    from PIL import Image

    figure = Image.open(tmp_path / files["figure"])
    assert figure.width > 5 * 256  # five panels, each enlarged to at least 256 px


def test_a_pixel_off_by_more_than_one_level_fails(tmp_path):
    noise = np.zeros((16, 16, 3), np.float32)
    noise[3, 5, 1] = 2 / 255
    report = _run(tmp_path, image_noise=noise)
    assert not report["passed"]
    by_pair = {(c["test"], c["reference"]): c for c in report["comparisons"]}
    assert any("max |diff|" in f for f in by_pair[("token_ring", "ring")]["failures"])
    assert by_pair[("ring", "single")]["failures"] == []  # shown, not checked


def test_a_run_on_the_wrong_ring_fails(tmp_path):
    report = _run(tmp_path, wrong_path=True)
    assert not report["passed"]
    assert report["path_problems"] and "xDiT + TokenRing" in report["path_problems"][0]


@pytest.mark.parametrize(
    "fake, code", [({}, compare.EXIT_OK), ({"wrong_path": True}, compare.EXIT_FAILED)]
)
def test_cli_exit_codes(fake, code, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr("tokenring_xdit.tools.launch.launch", _fake_launcher(**fake))
    argv = ["compare", "--height", "16", "--width", "16", "--steps", "3", "--out", str(tmp_path)]
    assert cli.main([*argv, "--no-progress"]) == code
    out = capsys.readouterr().out
    assert "TokenRing vs ring" in out and "pixart-tiny-compare.png" in out
    # the CPU times come with the caveat that they are no performance claim
    words = " ".join(out.split())  # rich wraps the note at the console width
    assert "CPU timings" in words and "no performance claim" in words


def test_worker_failure_exits_3(tmp_path, monkeypatch, capsys):
    from tokenring_xdit.tools.launch import LaunchError, RankFailure

    def fail(*args, **kwargs):
        raise LaunchError("1 of 2 rank(s) failed", [RankFailure(1, "ValueError", "boom", "tb")])

    monkeypatch.setattr("tokenring_xdit.tools.launch.launch", fail)
    assert cli.main(["compare", "--no-progress", "--out", str(tmp_path)]) == compare.EXIT_WORKER
    assert "rank 1: ValueError: boom" in capsys.readouterr().err


def test_image_metrics_and_gain():
    from tokenring_xdit.tools.images import auto_gain, diff_map, image_metrics

    a = _image()
    b = a.copy()
    b[0, 0, 0] += 1e-3
    m = image_metrics(b, a)
    assert m["max_abs_diff"] == pytest.approx(1e-3, rel=1e-3)
    mse = (1e-3) ** 2 / a.size
    assert m["psnr_db"] == pytest.approx(10 * math.log10(1 / mse), abs=0.05)
    assert 0.99 < m["ssim"] <= 1.0
    assert image_metrics(a, a)["psnr_db"] == math.inf
    assert auto_gain(1e-3) == 1000.0 and auto_gain(6e-7) == 1e6 and auto_gain(0.0) == 1.0
    heat = diff_map(b, a, 2000.0)  # 1e-3 x 2000 clips to white
    assert heat.shape == a.shape and heat[0, 0].tolist() == [1.0, 1.0, 1.0]
    assert heat[1:, 1:].max() == 0.0


# ------------------------------------------------------------------------------------------
# --host diffusers (the end-to-end run: test_compare_diffusers.py)


def test_diffusers_host_defaults_to_flux():
    cfg = _resolve(["--host", "diffusers"])
    assert (cfg.host, cfg.model, cfg.nproc, cfg.ring) == ("diffusers", "flux", 2, 2)
    assert cfg.name == "flux-tiny-diffusers"  # its files do not overwrite the xDiT run's
    assert _resolve([]).host == "xdit" and _resolve(["--model", "flux"]).name == "flux-tiny"


def test_diffusers_host_refuses_pixart_with_exit_2(monkeypatch, capsys):
    """diffusers' context parallelism needs a _cp_plan, which PixArt has not."""
    monkeypatch.setattr("tokenring_xdit.tools.launch.launch", _no_launch)
    code = cli.main(["compare", "--host", "diffusers", "--model", "pixart", "--no-progress"])
    assert code == compare.EXIT_USAGE
    err = capsys.readouterr().err
    assert "--host diffusers cannot run --model pixart" in err and "_cp_plan" in err


def test_diffusers_path_check_uses_its_own_ring_counter():
    from tokenring_xdit.tools.compare.report import path_checks

    def runs(ring: dict, token_ring: dict) -> dict:
        return {
            "ring": {"ring_calls_per_rank": [ring] * 2},
            "token_ring": {"ring_calls_per_rank": [token_ring] * 2},
        }

    good = runs({"token_ring": 0, "diffusers_ring": 6}, {"token_ring": 6, "diffusers_ring": 0})
    assert path_checks(good, "diffusers") == []
    fell_back = runs({"token_ring": 0, "diffusers_ring": 6}, {"token_ring": 0, "diffusers_ring": 6})
    problems = path_checks(fell_back, "diffusers")
    assert len(problems) == 2 and problems[0].startswith("diffusers CP + TokenRing rank 0")


# ------------------------------------------------ long CPU runs, SIGTERM


def test_sigterm_cleans_up_as_ctrl_c_does(tmp_path):
    """SIGTERM while the ranks run: the ranks stop, the launcher's temporary directory is
    removed and no semaphore of the result queue leaks (the default SIGTERM action left the
    directory, the semaphores and a running rank behind)."""
    import os
    import signal
    import subprocess
    import sys
    import time

    temp = tmp_path / "tmp"
    temp.mkdir()
    env = dict(os.environ, TMPDIR=str(temp), OMP_NUM_THREADS="1")
    argv = [sys.executable, "-m", "tokenring_xdit.tools.cli", "compare", "--no-progress"]
    argv += ["--steps", "50", "--out", str(tmp_path / "out")]
    log = tmp_path / "stderr.txt"
    with open(log, "wb") as err:  # a file, not a pipe: a leftover rank would hold a pipe open
        proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=err,
                                start_new_session=True)  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while not list(temp.glob("tokenring-xdit-*")) and time.monotonic() < deadline:
            assert proc.poll() is None, log.read_text()
            time.sleep(0.2)
        assert list(temp.glob("tokenring-xdit-*")), "the launch never started"
        time.sleep(2.0)  # the rank is up and has used the queue
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
        time.sleep(1.0)  # the resource tracker reports leaks after the launcher exits
        left = subprocess.run(
            ["ps", "-o", "pid,args", "-s", str(proc.pid)], capture_output=True, text=True
        ).stdout
        assert "spawn_main" not in left, left
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # only this test's own session
        except ProcessLookupError:
            pass
    assert proc.returncode == 128 + signal.SIGTERM, log.read_text()[-3000:]
    assert not list(temp.glob("tokenring-xdit-*")), list(temp.iterdir())
    assert "leaked semaphore" not in log.read_text(), log.read_text()[-3000:]


def test_full_size_flux_on_cpu_is_refused_with_an_estimate_unless_forced(capsys, monkeypatch):
    from tokenring_xdit.tools.compare import estimate as est

    monkeypatch.setattr(est, "total_memory", lambda: 24 * est.GIB)
    argv = ["compare", "--model", "flux", "--size", "full", "--device", "cpu"]
    assert cli.main(argv) == compare.EXIT_USAGE
    err = " ".join(capsys.readouterr().err.split())
    assert err.startswith("tokenring-xdit compare: error: Flux.1 full in float32 on CPU needs")
    assert "44.6 GiB of weights" in err and "this machine has 24 GiB" in err, err
    assert "--force" in err and "--size tiny" in err, err


def test_long_cpu_runs_are_warned_about_with_progress_lines(tmp_path, capsys, monkeypatch):
    """A full-size PixArt on CPU fits but takes hours: a warning with the estimate, then the
    run (here a stand-in launcher whose steps take LINE_EVERY_S each) prints its steps."""
    from tokenring_xdit.tools.compare import estimate as est
    from tokenring_xdit.tools.compare import run as run_mod

    monkeypatch.setattr(est, "total_memory", lambda: 24 * est.GIB)
    monkeypatch.setattr(run_mod, "matmul_flops_per_s", lambda: 20e9)
    monkeypatch.setattr(run_mod._StepLines, "LINE_EVERY_S", 0.0)
    monkeypatch.setattr("tokenring_xdit.tools.launch.launch", _fake_launcher())
    argv = ["compare", "--size", "full", "--device", "cpu", "--steps", "3", "--out", str(tmp_path)]
    cli.main([*argv, "--height", "64", "--width", "64"])
    got = capsys.readouterr()
    assert "warning" not in got.err  # 64 px: seconds
    cli.main(argv)
    got = capsys.readouterr()
    err = " ".join(got.err.split())
    assert "warning: on CPU this needs about" in err and " h of CPU work" in err, err
    assert "denoising, step 3/3" in got.out, got.out
