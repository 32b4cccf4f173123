# fixed-embed: every command of the README. `make help` lists them.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

GPUS      ?= 2
NODES     ?= 1
STRATEGY  ?= ddp
ARGS      ?=

DATA      ?=
TOKENIZER ?=
# TensorBoard's address: loopback unless set on the command line (make tensorboard HOST=0.0.0.0 PORT=6010).
# `:=`, not `?=`: a HOST from the environment (tcsh exports the machine's name) must not widen the bind.
HOST      := 127.0.0.1
PORT      := 6006
# The variant's config first, then the strategy's: later flags override both. --ckpt_path=last: a requeued
# or relaunched job resumes its run; ARGS="--run NAME" starts another.
# STRATEGY names a file of experiments/strategies/ (ddp, fsdp).
fit = $(BIN)/fixed-embed fit --config experiments/paper/$(1).yaml --config experiments/strategies/$(STRATEGY).yaml \
	--trainer.devices=$(GPUS) --trainer.num_nodes=$(NODES) --ckpt_path=last \
	$(if $(DATA),--data.train=$(DATA)) $(if $(TOKENIZER),--data.tokenizer=$(TOKENIZER)) $(ARGS)

.PHONY: help install test test-fast lint size bench bench-core bench-data bench-loop bench-eval bench-memory bench-trace bench-gpu gpu-check demo rehearsal study study-gpu controls sweep-recodings tensorboard fit-learned fit-binary16 fit-gf2

help:
	@grep -E '^[a-z0-9-]+:.*## ' $(MAKEFILE_LIST) | sed 's/:.*## /\t/'

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	# torch first, pinned: the CPU wheel cached on the dev machines (a newer one pulls CUDA builds).
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

install: $(STAMP) ## create .venv with the project and its dev extras (idempotent)

# pytest-xdist workers: most tests keep one core busy, so 2 on a 2-core machine; multi-rank runs share one
# worker (tests/conftest.py). TEST_JOBS=0 runs in this process (a debugger, -s output).
TEST_JOBS ?= 2
test_jobs = $(if $(filter 0,$(TEST_JOBS)),,-n $(TEST_JOBS) --dist loadgroup)

test: install ## the whole test suite, as CI runs it (CPU, offline, <= 10 min on 2 cores)
	$(BIN)/python -m pytest -q -ra $(test_jobs) --durations=10

test-fast: install ## the inner loop: every in-process test, no subprocess or multi-rank run (<= 2.5 min)
	$(BIN)/python -m pytest -q -ra $(test_jobs) -m "not slow" --durations=5

lint: install ## ruff (rules, formatting), the layers' import contracts, the code-token budgets (pyproject.toml)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports
	$(BIN)/python -m pytest -q tests/test_layout.py

bench-core: install ## input-layer forward+backward time and training-state bytes per interface
	$(BIN)/python benchmarks/input_layer.py

bench-data: install ## data throughput: streaming tokenize+pack vs pretokenize vs token-shard reads (SmolLM2, gutenberg-prose)
	$(BIN)/python benchmarks/data_throughput.py

# A small pre-tokenized sample for tests and the GPU checks: built once, not committed (shards/ is ignored).
SAMPLE_SHARDS := shards/gutenberg-prose-smollm2
.PHONY: shards-sample
shards-sample: $(SAMPLE_SHARDS)/token_shards.json ## token shards of gutenberg-prose, SmolLM2 tokenizer (~25 MB) -> shards/gutenberg-prose-smollm2/

$(SAMPLE_SHARDS)/token_shards.json: | $(STAMP)
	$(BIN)/fixed-embed pretokenize --data ../shared/data/gutenberg-prose/train.jsonl \
		--tokenizer ../shared/data/smollm2-tokenizer --out $(SAMPLE_SHARDS) --shards 8 --workers 2

bench-loop: install ## tokens/s of `fixed-embed fit` vs a plain PyTorch loop, tiny config, per interface
	$(BIN)/python benchmarks/lightning_overhead.py $(ARGS)

bench-eval: install ## lm-eval requests/s: our model class vs lm-eval's hf backend on the export
	$(BIN)/python benchmarks/eval_throughput.py $(ARGS)

bench-memory: install ## peak RSS of one training step (V 49,152, T 2,048, batch 8): full logits vs chunked loss (~12 GiB RAM)
	$(BIN)/python benchmarks/memory.py $(ARGS)

bench-trace: install ## the paper's update traced on fake tensors (memory per rank, FLOPs) against the estimate (~30 min)
	$(BIN)/python benchmarks/traced_memory.py $(ARGS)

bench: bench-core bench-data bench-loop bench-eval bench-memory ## every CPU benchmark

bench-gpu: install ## GPU: paper 1.7B training step (chunked loss, accumulation), tokens/s, MFU, peak vs estimate; eager/compile/AC (< 5 min)
	$(BIN)/python benchmarks/gpu.py $(ARGS)

gpu-check: install ## GPU: the prepared first-GPU check: bench rows, DDP + FSDP2 paper fits (compile, AC, SIGTERM, resume), recompiles, memory (<= 10 min) -> logs/gpu-check/report.md
	$(BIN)/python benchmarks/gpu_check.py $(if $(wildcard $(SAMPLE_SHARDS)/token_shards.json),--data $(SAMPLE_SHARDS)) $(ARGS)

rehearsal: install ## the paper's config (DDP, FSDP) on 2 CPU processes: updates, validation, checkpoint, benchmark, SIGTERM, relaunch (< 10 min)
	$(BIN)/python experiments/rehearsal.py $(ARGS)

demo: install ## train the three tiny variants on CPU on the offline corpus, print a table
	$(BIN)/python experiments/demo.py $(ARGS)

# The study on another corpus (DATA: local file, folder or glob, since the study permutes whole documents;
# VALID: its held-out documents; without VALID a hash hold-out of DATA, read as whole documents, not
# passages) writes to logs/study-data/, never over the committed results.
# Stopped at any point (Ctrl-C, a kill), the same command continues: finished runs are skipped and a
# run cut off resumes from its checkpoint. ARGS="--estimate" prints the plan and its compute.
study: install ## the learned table vs fixed codes: a rate sweep per size (3 sizes), training lengths, codebooks, 3 seeds, controls (~7 h CPU; resumes) -> docs/results/study-v3.md
	$(BIN)/python experiments/study.py $(if $(DATA),--out logs/study-data/study --logs logs/study-data) $(ARGS) \
		$(if $(DATA),-- --data.train=$(DATA) --data.valid=$(or $(VALID),null) $(if $(VALID),,--data.passage_chars=null))

# The GPU plan reads FineWeb-Edu as token shards: pretokenize on a machine with the hub, copy shards/ to the
# GPU node (about 2 bytes per token: ~20 GB for sample-10BT).
FINEWEB_SHARDS := shards/fineweb-edu-smollm2
WORKERS ?= 8
.PHONY: shards-fineweb
shards-fineweb: install ## FineWeb-Edu sample-10BT -> token shards for make study-gpu (needs the hub; WORKERS=8)
	$(BIN)/fixed-embed pretokenize --data HuggingFaceFW/fineweb-edu --hub-name sample-10BT --split train \
		--tokenizer ../shared/data/smollm2-tokenizer --out $(FINEWEB_SHARDS) --shards 256 --workers $(WORKERS)

study-gpu: install ## the same study at 25M-302M parameters, from make shards-fineweb (DATA= other data; ARGS=--estimate: runs, hours, wall time at --jobs; ARGS="--executor slurm --jobs 16": one SLURM job per run, docs/cluster.md; ARGS=--status; ARGS=--smoke: 2 updates per config on CPU)
	$(BIN)/python experiments/study.py --gpu $(ARGS) $(if $(DATA),-- --data.train=$(DATA))

controls: install ## the paper's tiny variants beside every control in experiments/beyond/ -> docs/results/controls.md
	$(BIN)/python experiments/controls.py $(ARGS)

sweep-recodings: install ## GF(2) seeds and random injections at tiny scale -> docs/results/recodings.md
	$(BIN)/python experiments/recodings.py $(ARGS)

fit-learned: install ## paper scale, learned table (override GPUS NODES STRATEGY DATA TOKENIZER ARGS)
	$(call fit,learned)

fit-binary16: install ## paper scale, 16-bit binary code
	$(call fit,binary16)

fit-gf2: install ## paper scale, GF(2)-recoded code (seed 12345)
	$(call fit,gf2)

tensorboard: install ## watch logs/ in TensorBoard on 127.0.0.1:6006 (HOST=0.0.0.0 PORT=6010 to serve others)
	@case "$(HOST)" in 127.*|localhost|::1) ;; *) echo "warning: HOST=$(HOST) serves every run's logs, configs and benchmark outputs, unauthenticated, to anyone who can reach this machine" >&2 ;; esac
	$(BIN)/tensorboard --logdir logs --reload_multifile true --host $(HOST) --port $(PORT)

size: install ## code tokens and lines per package of the library and experiments/ (the budgets: pyproject.toml)
	$(BIN)/python -m tests.code_tokens
