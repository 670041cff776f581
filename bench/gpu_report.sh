#!/usr/bin/env bash
# The GPU report in parts that each fit one device call (under 9.5 minutes on an H100, start-up not
# counted), most important first; every step has its own time limit, so a part always ends and
# returns what it measured. Usage: bench/gpu_report.sh PART OUT_DIR PYTHON  (`make gpu-report PART=1`)
#   1: the CUDA tier (tests/test_gpu.py) alone: on 2026-11-26 its first 18 tests took 240 s; the
#      0.5B peak-memory test alone took 136 s on 2026-11-27 (without its samples and task eval)
#   2: 0.5B packtrain vs HF Trainer + torch_compile, side by side, same micro-batch (16 x 1): 445 s
#      for parts 2 and 4 together on 2026-11-27 (packtrain 1.27x; docs/BENCHMARKS.md)
#   3: 7B LoRA, then 7B QLoRA (packtrain, micro-batch 1 x 8, gradient checkpointing)
#   4: the 0.5B peers: HF Trainer eager, the padded 'before' setup, TRL SFTTrainer packing, with
#      packtrain in the same command, at 4 x 4 (at 16 x 1 HF eager and 'before' ran out of memory on
#      an 80 GiB H100, 2026-11-27; 239 s for hf, before and packtrain at 4 x 4)
#   5: 7B LoRA with per_device_train_batch_size: auto for 8 blocks (checkpointing as auto decides):
#      what micro-batch 1 x 8 (part 3) leaves on an 80 GiB card (2026-11-27: ended by a 265 s limit)
set -uo pipefail
part=${1:?PART: 1, 2, 3, 4 or 5}; out=${2:-gpu-report}; py=${3:-python3}
mkdir -p "$out"
t0=$(date +%s)
say() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
bench() {  # limit name args...
    local limit=$1 name=$2; shift 2
    timeout -k 5 "$limit" "$py" bench/train_bench.py --steps 6 --work-dir /tmp/packtrain-bench \
        --json "$out/$name.json" "$@" 2>&1 | tee "$out/$name.md"
    say "$name: exit ${PIPESTATUS[0]} (124: its ${limit} s limit ended it)"
}
small=(--arch qwen2.5-0.5b --batch-size 16 --grad-accum 1)
large=(--arch qwen2.5-7b --batch-size 1 --grad-accum 8 --gradient-checkpointing)
case $part in
1) # log_cli: each test's training log streams to test-gpu.log, so a test the limit ends shows where
   # it was (the 0.5B peak-memory test printed nothing when a limit ended it: 2026-11-26/27)
   timeout -k 5 550 "$py" -m pytest -v -m cuda tests/test_gpu.py -p no:cacheprovider --durations=0 \
       -o log_cli=true --log-cli-level=INFO 2>&1 \
       | tee "$out/test-gpu.log" | grep -E "PASSED|FAILED|ERROR|SKIPPED|passed|failed|s call|micro-batch auto"
   say "CUDA tier: exit ${PIPESTATUS[0]} (124: its 550 s limit ended it)" ;;
2) bench 550 bench-0.5b "${small[@]}" --contenders packtrain,hf-compile --contender-limit 300 ;;
3) bench 270 bench-7b "${large[@]}" --contenders packtrain
   bench 270 bench-7b-qlora "${large[@]}" --method qlora --contenders packtrain ;;
4) bench 550 bench-0.5b-peers --arch qwen2.5-0.5b --batch-size 4 --grad-accum 4 --contenders hf,before,trl,packtrain --contender-limit 300 ;;
5) bench 550 bench-7b-auto --arch qwen2.5-7b --batch-size 1 --grad-accum 8 --contenders packtrain-auto ;;
*) echo "PART must be 1, 2, 3, 4 or 5" >&2; exit 2 ;;
esac
say "part $part done"
