#!/usr/bin/env bash
# Typical launches of the TokenRing examples; run from the repository root (docs/examples.md).
#
#   bash examples/run.sh cpu     # tiny random-weight models, 2 CPU processes (gloo, fp32)
#   bash examples/run.sh gpu     # full-size random-weight models at 1024 px on 2 GPUs (bf16)
#   bash examples/run.sh gpu4    # ulysses 2 x ring 2 and CFG 2 x ring 2 on 4 GPUs
#   MODEL_DIR=/path/to/PixArt-XL-2-1024-MS FLUX_DIR=/path/to/FLUX.1-dev \
#       bash examples/run.sh ckpt   # real local checkpoints on 2 GPUs: the prompt is used
#
# Each pair of launches differs only in --ring_impl_type: `default` is xDiT's own ring, `token_ring`
# (the examples' default) is TokenRing. Images go to results/ (--output_dir); the last rank prints
# the time of every step. Nothing is downloaded.
set -euo pipefail
cd "$(dirname "$0")/.."
TORCHRUN=${TORCHRUN:-torchrun}
PROMPT="brown dog laying on the ground with a metal bowl in front of him."

case "${1:-cpu}" in
cpu)
    # --tiny is the default on CPU; 128 x 128 px
    for impl in default token_ring; do
        $TORCHRUN --nproc_per_node=2 examples/pixart_tokenring.py \
            --ring_degree 2 --num_inference_steps 8 --ring_impl_type "$impl"
        $TORCHRUN --nproc_per_node=2 examples/flux_tokenring.py \
            --ring_degree 2 --num_inference_steps 8 --ring_impl_type "$impl"
    done
    # ulysses 2 x ring 2 on 4 processes
    $TORCHRUN --nproc_per_node=4 examples/pixart_tokenring.py \
        --ulysses_degree 2 --ring_degree 2 --num_inference_steps 8
    ;;
gpu)
    # the real PixArt-alpha XL-2 1024 and Flux.1-dev architectures, seeded random weights
    for impl in default token_ring; do
        $TORCHRUN --nproc_per_node=2 examples/pixart_tokenring.py \
            --ring_degree 2 --height 1024 --width 1024 --num_inference_steps 20 \
            --ring_impl_type "$impl"
        $TORCHRUN --nproc_per_node=2 examples/flux_tokenring.py \
            --ring_degree 2 --height 1024 --width 1024 --num_inference_steps 28 \
            --max_sequence_length 512 --ring_impl_type "$impl"
    done
    # the same PixArt run with the transformer replayed as one CUDA graph per step
    $TORCHRUN --nproc_per_node=2 examples/pixart_tokenring.py \
        --ring_degree 2 --height 1024 --width 1024 --num_inference_steps 20 \
        --ring_impl_type token_ring --cuda_graph_transformer
    ;;
gpu4)
    $TORCHRUN --nproc_per_node=4 examples/pixart_tokenring.py \
        --ulysses_degree 2 --ring_degree 2 --num_inference_steps 20
    $TORCHRUN --nproc_per_node=4 examples/pixart_tokenring.py \
        --use_cfg_parallel --ring_degree 2 --num_inference_steps 20
    $TORCHRUN --nproc_per_node=4 examples/flux_tokenring.py \
        --ulysses_degree 2 --ring_degree 2 --num_inference_steps 28 --max_sequence_length 512
    ;;
ckpt)
    $TORCHRUN --nproc_per_node=2 examples/pixart_tokenring.py --model "${MODEL_DIR:?set MODEL_DIR}" \
        --ring_degree 2 --num_inference_steps 20 --guidance_scale 4.5 --prompt "$PROMPT"
    $TORCHRUN --nproc_per_node=2 examples/flux_tokenring.py --model "${FLUX_DIR:?set FLUX_DIR}" \
        --ring_degree 2 --num_inference_steps 28 --max_sequence_length 512 --prompt "$PROMPT"
    ;;
*)
    echo "usage: bash examples/run.sh [cpu|gpu|gpu4|ckpt]" >&2
    exit 2
    ;;
esac
