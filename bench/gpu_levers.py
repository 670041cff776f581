"""The levers one at a time on the GPU (docs/BENCHMARKS.md, run 2): `packtrain.trainer.train.run` with the bench's
config and one override, one process per variant. Usage, on the GPU machine:

    python3 bench/gpu_levers.py build [ARCH]; STEPS=6 MB=2 GA=8 python3 bench/gpu_levers.py nocompile-ref [ARCH]

Variant names combine: nocompile, ref (reference attention + chunked loss), auto (auto micro-batch), qlora.
WORK: the folder for the model, the build and the runs (default /tmp/w-ARCH; a variant's run is never
overwritten: a second run of one variant there is refused)."""
import argparse, json, os, sys, time
from pathlib import Path
sys.path.insert(0, os.getcwd())
import bench.train_bench_setup as tb

def main():
    variant = sys.argv[1]
    arch = sys.argv[2] if len(sys.argv) > 2 else "qwen2.5-0.5b"
    args = argparse.Namespace(method="lora", steps=int(os.environ.get("STEPS", 6)), batch_size=int(os.environ.get("MB", 2)),
                              grad_accum=int(os.environ.get("GA", 8)), gradient_checkpointing=bool(os.environ.get("CKPT")))
    if variant.startswith("qlora"):
        args.method = "qlora"
    work = Path(os.environ.get("WORK", f"/tmp/w-{arch}"))
    model, _ = tb.model_dir(arch, work)
    if variant == "build":
        tb.build_blocks(args, model, work); return
    import torch
    from packtrain.trainer import attention as A
    config = tb.expert_config(args, model, work / "cache", work / "runs", variant)
    t = config.train
    if "nocompile" in variant: t.torch_compile = False
    if "ref" in variant: config.model.varlen_attention = False; t.fused_loss = False
    if "auto" in variant:  # auto sets the accumulation (any other value beside it is a config error)
        t.per_device_train_batch_size = "auto"; t.global_batch_size = args.batch_size * args.grad_accum; t.gradient_accumulation_steps = 1
    from packtrain.trainer.train import run
    if torch.cuda.is_available(): torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    run_dir = run(config, work / "cache")
    s = json.loads((run_dir / "summary.json").read_text())
    info = json.loads((run_dir / "run.json").read_text())
    recs = [json.loads(l) for l in (run_dir / "metrics.jsonl").read_text().splitlines() if '"tok_s"' in l]
    print(f"RESULT {variant}: tok/s {s['mean_tok_s']:,.0f} sup {s['mean_sup_tok_s']:,.0f} mfu {'n/a' if s['mean_mfu'] is None else format(s['mean_mfu'], '.3f')} "
          f"wait {s['mean_data_wait']:.4f} peak {(torch.cuda.max_memory_allocated()/2**30 if torch.cuda.is_available() else 0):.2f} GiB micro {info['per_device_train_batch_size']} "
          f"ckpt {info['gradient_checkpointing']} attn {info['attention']} compile {info['torch_compile']} fused {info['fused_loss']} "
          f"step_s {[round(r['step_s'],3) for r in recs]} wall {time.perf_counter()-start:.0f}s", flush=True)


if __name__ == "__main__":
    main()
