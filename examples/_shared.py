"""What pixart_tokenring.py and flux_tokenring.py share: set-up before xfuser is imported, xDiT's
own parser (plus a few flags of ours), the pipeline (a local checkpoint or random weights), the
timed call and the saved images.

Run under torchrun: xDiT reads RANK / WORLD_SIZE / LOCAL_RANK from the environment and makes the
process group itself (NCCL on GPU; gloo on CPU, where xDiT's CPU mode is switched on first).
Nothing heavy is imported here at the top: set_up() checks our own flags before torch and xfuser
load (on a busy machine that takes tens of seconds, too long to wait for a misspelled value).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import warnings
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


def quiet_hosts() -> None:
    """Keep the host libraries' start-up chatter (xDiT's DEBUG/INFO log lines, transformers' and
    diffusers' notices, torch's FutureWarnings) out of the way of the result: warnings and
    errors only. Setting LOG_LEVEL, TRANSFORMERS_VERBOSITY, DIFFUSERS_VERBOSITY or
    PYTHONWARNINGS yourself shows them again."""
    for var, level in (
        ("LOG_LEVEL", "warning"),  # xfuser.logger
        ("TRANSFORMERS_VERBOSITY", "error"),
        ("DIFFUSERS_VERBOSITY", "error"),
    ):
        os.environ.setdefault(var, level)
    if not sys.warnoptions:
        warnings.filterwarnings("ignore", category=FutureWarning)


def add_our_flags(parser: argparse.ArgumentParser) -> None:
    """The flags these scripts add to xDiT's (its --ring_impl_type is ours too: the xfuser patch
    adds it)."""
    parser.add_argument(
        "--tiny",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="random weights only: a 2-layer model with a tiny VAE instead of the real "
        "architecture (default: on CPU yes, on GPU no)",
    )
    parser.add_argument("--output_dir", default="results", help="where images go (results)")
    parser.add_argument(
        "--warmup_call_steps",
        type=int,
        default=2,
        help="an untimed call with this many steps first (0: none; default 2)",
    )
    parser.add_argument(
        "--cuda_graph_transformer",
        action="store_true",
        help="replay the transformer as one CUDA graph per step (sets "
        "TOKENRING_XDIT_CUDA_GRAPH_TRANSFORMER=1; GPU only, ignored on CPU)",
    )


def check_our_flags(argv: list[str] | None = None) -> None:
    """Refuse a bad value of one of our flags (e.g. `--ring_impl_type tokenring`) with the line
    xDiT's parser would print, but before torch and xfuser are imported. The other flags are
    left to xDiT's parser."""
    from tokenring_xdit.config import RING_IMPLS
    from tokenring_xdit.tools.rank_exit import one_line_usage_errors

    # no abbreviations: `--ring 2` is xDiT's parser's to call ambiguous, not ours to take
    pre = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    pre.add_argument("--ring_impl_type", choices=RING_IMPLS)
    add_our_flags(pre)
    one_line_usage_errors(pre).parse_known_args(argv)


def set_up() -> str:
    """Returns "cuda" or "cpu". Must run before the first `import xfuser`."""
    from tokenring_xdit.tools.rank_exit import exit_on_interrupt

    exit_on_interrupt()  # Ctrl-C while torch and xDiT load: one line per rank too
    check_our_flags()
    import torch

    quiet_hosts()
    # Nothing is ever downloaded: a --model that is not a local folder fails instead.
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if torch.cuda.is_available():
        device = "cuda"
    else:
        # xDiT (xfuser 0.7.0) on CPU, gloo between the processes: see docs/cpu-mode.md
        from tokenring_xdit.patches import xfuser_cpu

        xfuser_cpu.enable()
        device = "cpu"
    import tokenring_xdit

    # TokenRing's patches (xDiT's --ring_impl_type flag, the ring dispatch); the package's .pth
    # applies them too when installed, unless TOKENRING_XDIT_AUTOPATCH=0.
    tokenring_xdit.install()
    return device


def parse_args(description: str, device: str, full_pixels: int = 1024):
    """xDiT's own command line (FlexibleArgumentParser + xFuserArgs.add_cli_args, which our patch
    extends with --ring_impl_type) plus --tiny and --output_dir. Returns (args, engine_config,
    input_config); the process group exists afterwards."""
    from xfuser import xFuserArgs
    from xfuser.config import FlexibleArgumentParser

    from tokenring_xdit.hosts.selection import RING_IMPL_ENV, TOKEN_RING
    from tokenring_xdit.tools.rank_exit import one_line_usage_errors

    parser = FlexibleArgumentParser(description=description)
    parser = one_line_usage_errors(xFuserArgs.add_cli_args(parser))
    for action in parser._actions:
        if "--model" in action.option_strings:  # optional here: no model = random weights
            action.required = False
            action.default = None
            action.help = (
                "a local diffusers checkpoint folder (nothing is downloaded); without it the real "
                "architecture is built with seeded random weights and no text encoder"
            )
        if "--ring_impl_type" in action.option_strings:
            action.help += " This script's default: token_ring."
        if "--prompt" in action.option_strings:
            action.help = (
                "prompt; used with --model, ignored with random weights (there is no text "
                "encoder: the prompt embeddings are seeded random)"
            )
    add_our_flags(parser)
    parser.set_defaults(height=None, width=None, max_sequence_length=None)
    args = parser.parse_args()
    if args.cuda_graph_transformer:
        from tokenring_xdit.hosts.transformer_graphs import GRAPH_TRANSFORMER_ENV

        os.environ[GRAPH_TRANSFORMER_ENV] = "1"  # read when xDiT wraps the transformer
    if args.tiny is None:
        args.tiny = device == "cpu" and args.model is None
    # xDiT's default (256), or 16 prompt tokens for the tiny random models
    args.max_sequence_length = args.max_sequence_length or (16 if args.tiny else 256)
    if args.model is not None and args.tiny:
        parser.error("--tiny is for random weights; drop it when you pass --model")
    if args.model is not None and not os.path.isdir(args.model):
        parser.error(f"--model {args.model}: not a local folder (this script downloads nothing)")
    pixels = 128 if args.tiny else full_pixels
    args.height = args.height or pixels
    args.width = args.width or pixels
    if args.ring_impl_type is None and not os.environ.get(RING_IMPL_ENV):
        args.ring_impl_type = TOKEN_RING  # this example's point; --ring_impl_type default: xDiT's
    if args.model is None:
        args.random_weights = True
        args.model = f"random-{'tiny' if args.tiny else 'full'}"  # a name for xDiT's config only
    else:
        args.random_weights = False
    engine_args = xFuserArgs.from_cli_args(args)  # reads --ring_impl_type
    engine_config, input_config = engine_args.create_config()  # makes the process group
    engine_config.runtime_config.dtype = dtype_for(device)
    return args, engine_args, engine_config, input_config


def dtype_for(device: str) -> torch.dtype:
    import torch

    return torch.bfloat16 if device == "cuda" else torch.float32


def local_device(device: str) -> str:
    from xfuser.core.distributed import get_world_group

    return f"cuda:{get_world_group().local_rank}" if device == "cuda" else "cpu"


def random_prompt_note(args) -> str | None:
    if args.random_weights and args.prompt:
        return "note: --prompt is ignored with random weights (seeded random prompt embeddings)"
    return None


class StepTimer:
    """Wall time of each denoising step, from the pipeline's step callback."""

    def __init__(self, device: str):
        self.cuda = device.startswith("cuda")
        self.step_s: list[float] = []
        self._last = 0.0

    def now(self) -> float:
        if self.cuda:
            import torch

            torch.cuda.synchronize()
        return time.perf_counter()

    def start(self) -> float:
        self.step_s = []
        self._last = self.now()
        return self._last

    def mark(self) -> None:
        now = self.now()
        self.step_s.append(now - self._last)
        self._last = now


def parallel_info(engine_args, engine_config) -> str:
    """xDiT's file-name convention, plus the ring implementation."""
    from tokenring_xdit.hosts.selection import xdit_ring_impl

    return (
        f"cfg{engine_config.parallel_config.cfg_degree}_ulysses{engine_args.ulysses_degree}_"
        f"ring{engine_args.ring_degree}_{xdit_ring_impl()[0]}"
    )


def run_settings(args) -> str:
    """What else changes the image, for its file name: runs do not overwrite each other."""
    return f"{args.width}x{args.height}_{args.num_inference_steps}steps_seed{args.seed}"


def report(name: str, pipe, output, timer: StepTimer, total_s: float, args, info: str) -> None:
    """On the last rank (where xDiT puts the images): save them, print the times."""
    from xfuser.core.distributed import get_world_group

    from tokenring_xdit.hosts.selection import xdit_ring_impl

    world = get_world_group()
    if output is not None and pipe.is_dp_last_group() and args.output_type == "pil":
        os.makedirs(args.output_dir, exist_ok=True)
        for i, image in enumerate(output.images):
            path = os.path.join(args.output_dir, f"{name}_{info}_{run_settings(args)}_{i}.png")
            image.save(path)
            print(f"image saved to {path}")
    if world.rank == world.world_size - 1:
        impl, source = xdit_ring_impl()
        steps = ", ".join(f"{s * 1e3:.1f}" for s in timer.step_s)
        print(f"ring attention: {impl} (selected by {source})")
        print(f"per-step ms: {steps}")
        mean = sum(timer.step_s) / max(1, len(timer.step_s))
        print(
            f"total time: {total_s:.2f} s for {len(timer.step_s)} steps "
            f"({mean * 1e3:.1f} ms/step, VAE decode included in the total)"
        )
    sys.stdout.flush()
