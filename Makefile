# Every target that needs Python sets up $(VENV) first (once; again when pyproject.toml changes).
#
#   make demo    start a server, lower a real model through it, compare with the local lowering
#   make test    check generated code, lint, run the whole test suite (PYTEST_ARGS=... passes on)
#   make test-fast  the same checks, then the tests not marked slow (under 3 minutes on 2 cores)
#   make serve   run the server on $(ADDRESS)
#   make conformance  ExecuTorch's backend test suite, each hosted flow vs its remote twin
#   make conformance-openvino  the same for the OpenVINO flows, in .venv-openvino
#   make conformance-arm  the same for the Arm flows, in .venv-arm
#   make venv-arm, make venv-openvino  the Arm and OpenVINO servers' environments (make test builds both)
#   make bench   remote vs local lowering, bytes, memory, worker throughput (BENCH_ARGS=... passes on),
#                then the load figures (make bench-load: stalled streams, concurrent uploads)
#   make bench-report  how long the llama2 delegation report page takes to open in Chromium
#   make image   build the server image (deploy/Dockerfile) with Docker: scripts/build_image.py
#   make image-arm, make image-openvino, make image-router  the Arm and OpenVINO environments'
#                server images and the front door's
#   make image-test  run that image as deploy/k8s/base's Deployment does, and check it (tests
#                marked `image`; `make test` leaves them out)
#   make bench-image  the image's size, cold and cached build times, time from `docker run` to SERVING

PYTHON ?= python3
VENV ?= .venv
ADDRESS ?= 127.0.0.1:50051
PYTEST_ARGS ?=
BENCH_ARGS ?=

BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# Folders git may not have (an empty one is not kept) are left out rather than failing ruff.
LINT_PATHS := $(wildcard cli proto server client tests scripts bench)

NODE_CLIENT := client/node

.PHONY: venv venv-arm venv-openvino node-client proto check-proto lint test test-fast demo serve bench bench-load bench-report conformance conformance-openvino conformance-arm clean distclean \
	image image-arm image-openvino image-router image-test bench-image

venv: $(STAMP)

# torch is installed on its own first, pinned, so that pip takes the CPU build available to it
# instead of resolving a plain `torch` requirement to the multi-GB CUDA build.
$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --upgrade pip
	$(BIN)/python -m pip install torch==2.13.0
	$(BIN)/python -m pip install -e '.[dev]'
	touch $@

# The server environments of the backends whose toolchains conflict with the main one
# (docs/environments.md), each a virtualenv .venv-FAMILY with the pyproject extra FAMILY:
# .venv-arm (arm_tosa, ethos_u55, ethos_u85: tosa-tools pins numpy and flatbuffers) and
# .venv-openvino (openvino: OpenVINO and NNCF pin numpy below the main environment's).
VENV_ARM := .venv-arm
VENV_OPENVINO := .venv-openvino
venv-arm: $(VENV_ARM)/.installed
venv-openvino: $(VENV_OPENVINO)/.installed

.venv-%/.installed: pyproject.toml
	test -x .venv-$*/bin/python || $(PYTHON) -m venv .venv-$*
	.venv-$*/bin/python -m pip install --upgrade pip
	.venv-$*/bin/python -m pip install torch==2.13.0
	.venv-$*/bin/python -m pip install -e '.[$*]'
	touch $@

# The Node.js client (client/node), installed from the npm registry as its lock file pins it.
node-client: $(NODE_CLIENT)/node_modules/.package-lock.json

$(NODE_CLIENT)/node_modules/.package-lock.json: $(NODE_CLIENT)/package-lock.json
	cd $(NODE_CLIENT) && npm ci --no-audit --no-fund

proto: venv
	$(BIN)/python scripts/gen_proto.py

check-proto: venv
	$(BIN)/python scripts/gen_proto.py --check

lint: venv
	$(BIN)/ruff check $(LINT_PATHS)
	@# proto/ imports neither client/ nor server/, they import proto/ only, cli/ joins them.
	$(BIN)/python scripts/check_layers.py
	@# mypy cannot follow the editable install's import hook: give it the package layout.
	@rm -rf build/mypy && mkdir -p build/mypy/remote_partitioner
	@cp -r cli proto server client build/mypy/remote_partitioner/
	@rm -rf build/mypy/remote_partitioner/client/node
	@touch build/mypy/remote_partitioner/__init__.py
	cd build/mypy && $(abspath $(BIN))/mypy --config-file ../../pyproject.toml --cache-dir ../mypy-cache \
		-p remote_partitioner.cli -p remote_partitioner.server -p remote_partitioner.client \
		-p remote_partitioner.proto.codec -m remote_partitioner.proto.errors \
		-m remote_partitioner.proto.spec -m remote_partitioner.proto.graph_check \
		-m remote_partitioner.proto.digests -m remote_partitioner.proto.program_errors \
		-m remote_partitioner.proto.transport

# The Arm and OpenVINO environments too: tests/test_arm.py and tests/test_openvino.py lower
# through servers running in them (and run each environment's conformance subset there).
test: venv $(VENV_ARM)/.conformance-stamp $(VENV_OPENVINO)/.conformance-stamp node-client check-proto lint
	ARM_PYTHON=$(abspath $(VENV_ARM))/bin/python OPENVINO_PYTHON=$(abspath $(VENV_OPENVINO))/bin/python \
		$(BIN)/python -m pytest -q -ra -m "not conformance and not image" --durations=15 \
		$(PYTEST_ARGS) tests

# The quick loop: everything but the tests marked `slow` (soaks, fleets of server processes,
# the large example models). Still byte-identical lowerings of real models, every error path
# and the security checks.
test-fast: venv node-client check-proto lint
	$(BIN)/python -m pytest -q -ra -m "not slow and not conformance and not image" --durations=10 \
		$(PYTEST_ARGS) tests

demo: venv
	$(BIN)/python scripts/demo.py

serve: venv
	$(BIN)/python -m remote_partitioner.cli serve --address $(ADDRESS)

bench: venv
	$(BIN)/python bench/bench.py --json build/bench.json $(BENCH_ARGS)
	$(BIN)/python bench/load.py --json build/bench-load.json

# Throughput and latency with stalled streams, memory under concurrent uploads (~3 min).
bench-load: venv
	$(BIN)/python bench/load.py --json build/bench-load.json

# The llama2 report page in headless Chromium (Debian's chromium): time until drawn (goal < 3 s).
bench-report: venv node-client
	$(BIN)/python bench/report_page.py --json build/bench-report.json

# The server image. IMAGE_BASE: the base image (a Debian bookworm one is built with mmdebstrap
# when the default python:3.11-slim cannot be pulled); the wheelhouse comes from $(VENV).
IMAGE ?= remote-partitioner:0.1.0
IMAGE_BASE ?= python:3.11-slim
image: venv
	$(BIN)/python scripts/build_image.py --tag $(IMAGE) --base $(IMAGE_BASE)

# The Arm and OpenVINO environments' server images (the same Dockerfile, each environment's
# pins and extra) and the front door's (Debian's nginx): deploy/k8s/overlays/environments runs
# the four.
IMAGE_ARM ?= remote-partitioner-arm:0.1.0
IMAGE_OPENVINO ?= remote-partitioner-openvino:0.1.0
IMAGE_ROUTER ?= remote-partitioner-router:0.1.0
image-arm: venv-arm
	$(VENV_ARM)/bin/python scripts/build_image.py --extra arm --tag $(IMAGE_ARM) --base $(IMAGE_BASE)

image-openvino: venv-openvino
	$(VENV_OPENVINO)/bin/python scripts/build_image.py --extra openvino --tag $(IMAGE_OPENVINO) \
		--base $(IMAGE_BASE)

image-router: venv
	$(BIN)/python scripts/build_image.py --router --tag $(IMAGE_ROUTER) --base $(IMAGE_BASE)

# Runs $(IMAGE) as the Deployment in deploy/k8s/base does (with CI=true, no Docker is a failure).
image-test: venv
	RP_IMAGE=$(IMAGE) RP_IMAGE_ARM=$(IMAGE_ARM) RP_IMAGE_OPENVINO=$(IMAGE_OPENVINO) \
		RP_IMAGE_ROUTER=$(IMAGE_ROUTER) \
		$(BIN)/python -m pytest -q -ra -m image -p no:cacheprovider \
		--durations=10 $(PYTEST_ARGS) tests/test_image.py

bench-image: venv
	$(BIN)/python bench/image.py --image $(IMAGE) --base $(IMAGE_BASE) --json build/bench-image.json

clean:
	rm -rf build dist *.egg-info .pytest_cache .ruff_cache .mypy_cache .hypothesis
	rm -f *.pte
	find $(wildcard cli proto server client tests scripts bench) -name __pycache__ -prune \
		-exec rm -rf {} +

distclean: clean
	rm -rf $(VENV) $(VENV_ARM) $(VENV_OPENVINO) $(NODE_CLIENT)/node_modules

# ExecuTorch's backend conformance suite, every hosted flow and its remote twin (long on 2 cores;
# CONFORMANCE_ARGS=... passes on, e.g. --flows xnnpack --suite operators -k test_add), in one
# process per core (CONFORMANCE_JOBS) sharing one server.
CONFORMANCE_ARGS ?=
CONFORMANCE_JOBS ?= $(shell nproc 2>/dev/null || echo 1)
# First the runner's own checks (tests marked `conformance`: its per-process memos change no
# program), then the suite.
conformance: $(VENV)/.conformance-stamp
	$(BIN)/python -m pytest -q -ra -m conformance tests/test_conformance.py
	$(BIN)/python scripts/conformance.py --json build/conformance.json \
		--jobs $(CONFORMANCE_JOBS) $(CONFORMANCE_ARGS)

$(VENV)/.conformance-stamp: $(STAMP)
	$(BIN)/python -m pip install -e '.[dev,conformance]'
	touch $@

# The OpenVINO flows (openvino, openvino_int8) and their twins, run in the OpenVINO environment
# (the runner and the server it starts), which their backend needs.
conformance-openvino: $(VENV_OPENVINO)/.conformance-stamp
	$(VENV_OPENVINO)/bin/python scripts/conformance.py --flows openvino openvino_int8 \
		--json build/conformance-openvino.json --jobs $(CONFORMANCE_JOBS) $(CONFORMANCE_ARGS)

$(VENV_OPENVINO)/.conformance-stamp: $(VENV_OPENVINO)/.installed
	$(VENV_OPENVINO)/bin/python -m pip install -e '.[openvino,dev,conformance]'
	touch $@

# The Arm flows (arm_tosa_fp, arm_tosa_int, arm_ethos_u55, arm_ethos_u85) and their twins, in
# the Arm environment. Ethos-U's run step needs Arm's Corstone FVP, which no registry ships:
# those tests end PTE_RUN_FAIL on both sides, compared up to the .pte.
conformance-arm: $(VENV_ARM)/.conformance-stamp
	$(VENV_ARM)/bin/python scripts/conformance.py \
		--flows arm_tosa_fp arm_tosa_int arm_ethos_u55 arm_ethos_u85 \
		--json build/conformance-arm.json --jobs $(CONFORMANCE_JOBS) $(CONFORMANCE_ARGS)

$(VENV_ARM)/.conformance-stamp: $(VENV_ARM)/.installed
	$(VENV_ARM)/bin/python -m pip install -e '.[arm,dev,conformance]'
	touch $@
