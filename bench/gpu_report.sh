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
#   6: issue 45 in one call, 535 s of limits (4 optimizer steps per contender, 3 timed; every packtrain row
#      with train.torch_compile: regional, so no row spends minutes compiling):
#      p6-image         which of Unsloth's dependencies the image (or the carry) has: what `make unsloth-wheel` may drop
#      p6-7b-auto       7B LoRA, gradient_checkpointing + micro-batch auto for 8 blocks, then hf-compile at the
#                       micro-batch and checkpointing auto chose; printed against NeMo AutoModel's published
#                       14,110 tokens/s (targets: >= 15,000 and >= 2x hf-compile)
#      p6-7b-fp8        the same with model.base_precision: fp8 (target: >= 1.25x p6-7b-auto's packtrain row)
#      p6-7b-lora-24g   7B LoRA bf16 under train.max_memory_gib: 24, auto (target: trains, says what it chose)
#      p6-7b-qlora-24g  7B QLoRA, 8 blocks of 2048 per optimizer step, under 24 GiB, auto (the same target)
#      p6-0.5b-regional 0.5B at 16 x 1, regional compile: its first step's compile (target <= 30 s) apart from
#                       its steady tokens/s (target >= 150,000), and Unsloth at the same shape where it is
#                       installed (its wheels do not fit the carry beside part 6's: docs/BENCHMARKS.md)
#      Wheels: `make gpu-wheel PART=6` (part 6's own set: torchao in, datasets and trl out). Before the call,
#      on the CPU: `make gpu-report PART=6 DRY_RUN=1`: every step's command resolved (`train_bench.py
#      --dry-run`: arguments, every contender's config and --set override against the real schema, no model
#      loaded), the wheels part 6 installs all in .whl/ and the carry under 64 MiB (bench/gpu_carry.py),
#      the limits under 540 s; exit 1 naming each problem.
set -uo pipefail
part=${1:?PART: 1, 2, 3, 4, 5 or 6}; out=${2:-gpu-report}; py=${3:-python3}
dry=${DRY_RUN:-}; dry=${dry#0}  # DRY_RUN=1: check every command of the part on this machine, run none
mkdir -p "$out"
t0=$(date +%s); planned=0; failed=0; steps=6  # optimizer steps per contender (the first not timed)
say() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
bench() {  # limit name args...
    local limit=$1 name=$2; shift 2
    planned=$(( planned + limit ))
    if [ -n "$dry" ]; then
        "$py" bench/train_bench.py --steps "$steps" --work-dir /tmp/packtrain-bench --dry-run "$@" \
            || { failed=1; echo "DRY-RUN $name: a problem above"; }
        return
    fi
    timeout -k 5 "$limit" "$py" bench/train_bench.py --steps "$steps" --work-dir /tmp/packtrain-bench \
        --json "$out/$name.json" "$@" 2>&1 | tee "$out/$name.md"
    say "$name: exit ${PIPESTATUS[0]} (124: its ${limit} s limit ended it)"
}
# part 6's first step: the image's version of each package Unsloth's wheels ask for (absent: "-")
UNSLOTH_PROBE='from importlib.metadata import version
for n in "unsloth unsloth_zoo trl datasets xformers torchvision torchao diffusers pandas pillow sentencepiece protobuf hf_transfer tyro msgspec einops certifi triton".split():
    try: print("IMAGE", n, version(n))
    except Exception: print("IMAGE", n, "-")'
small=(--arch qwen2.5-0.5b --batch-size 16 --grad-accum 1)
large=(--arch qwen2.5-7b --batch-size 1 --grad-accum 8 --gradient-checkpointing)
case $part in
1) # log_cli: each test's training log streams to test-gpu.log, so a test the limit ends shows where
   # it was (the 0.5B peak-memory test printed nothing when a limit ended it: 2026-11-26/27)
   [ -n "$dry" ] && { echo "DRY-RUN part 1: would run the CUDA tier (tests/test_gpu.py), 550 s limit"; exit 0; }
   timeout -k 5 550 "$py" -m pytest -v -m cuda tests/test_gpu.py -p no:cacheprovider --durations=0 \
       -o log_cli=true --log-cli-level=INFO 2>&1 \
       | tee "$out/test-gpu.log" | grep -E "PASSED|FAILED|ERROR|SKIPPED|passed|failed|s call|micro-batch auto"
   say "CUDA tier: exit ${PIPESTATUS[0]} (124: its 550 s limit ended it)" ;;
2) bench 550 bench-0.5b "${small[@]}" --contenders packtrain,hf-compile --contender-limit 300 ;;
3) bench 270 bench-7b "${large[@]}" --contenders packtrain
   bench 270 bench-7b-qlora "${large[@]}" --method qlora --contenders packtrain ;;
4) bench 550 bench-0.5b-peers --arch qwen2.5-0.5b --batch-size 4 --grad-accum 4 --contenders hf,before,trl,packtrain --contender-limit 300 ;;
5) bench 550 bench-7b-auto --arch qwen2.5-7b --batch-size 1 --grad-accum 8 --contenders packtrain-auto ;;
6) steps=4
   auto=(--set train.gradient_checkpointing=auto --set train.torch_compile=regional)
   budget=(--set train.max_memory_gib=24)
   eight=(--batch-size 1 --grad-accum 8)  # with packtrain-auto: auto's micro-batch for 8 blocks per step
   planned=15
   if [ -n "$dry" ]; then
       echo "DRY-RUN p6-image: would list the image's versions of Unsloth's dependencies (15 s)"
   else
       timeout -k 5 15 "$py" -c "$UNSLOTH_PROBE" 2>&1 | tee "$out/p6-image.md"
   fi
   bench 230 p6-7b-auto --arch qwen2.5-7b "${eight[@]}" --contenders packtrain-auto,hf-compile \
       --same-micro-as packtrain-auto --contender-limit 120 "${auto[@]}"
   bench 90 p6-7b-fp8 --arch qwen2.5-7b "${eight[@]}" --contenders packtrain-auto "${auto[@]}" \
       --set model.base_precision=fp8
   bench 70 p6-7b-lora-24g --arch qwen2.5-7b "${eight[@]}" --contenders packtrain-auto "${auto[@]}" "${budget[@]}"
   bench 70 p6-7b-qlora-24g --arch qwen2.5-7b --method qlora "${eight[@]}" --contenders packtrain-auto \
       "${auto[@]}" "${budget[@]}"
   bench 60 p6-0.5b-regional --arch qwen2.5-0.5b --batch-size 16 --grad-accum 1 --contenders packtrain,unsloth \
       --contender-limit 55 --set train.torch_compile=regional
   if [ -n "$dry" ]; then
       if [ "$planned" -gt 540 ]; then failed=1; echo "DRY-RUN limits: PROBLEM $planned s, over part 6's 540 s"
       else echo "DRY-RUN limits: $planned s of part 6's 540 s"; fi
       # shellcheck disable=SC2086  # a list of names
       "$py" bench/gpu_carry.py --carry "${CARRY:-.whl}" --beside .whl-unsloth --need ${GPU_WHEELS:?GPU_WHEELS: run it as make gpu-report PART=6 DRY_RUN=1} \
           || failed=1
   fi ;;
*) echo "PART must be 1, 2, 3, 4, 5 or 6" >&2; exit 2 ;;
esac
if [ -n "$dry" ]; then
    [ "$failed" = 0 ] && say "part $part: dry run passed" || say "part $part: dry run FAILED (the problems above)"
    exit "$failed"
fi
say "part $part done"
