# FastPath: two commands from a fresh clone.
#   make serve   set up .venv, build artifacts if missing (fp32 v1, INT8 v2), run tritonserver with every model
#                (DEVICE=cuda: text_embedding from its GPU configuration, model_repository/text_embedding/configs/gpu.pbtxt)
#   make test    the same set-up, then ruff and the test suite
#   make perf-analyzer   perf_analyzer (Triton's C++ load generator, the served benchmarks' load) with its two
#                libraries in .venv (scripts/install_perf_analyzer.sh); part of make setup
#   make tcmalloc   tcmalloc for tritonserver in .venv/lib/tcmalloc (scripts/install_tcmalloc.sh; fastpath serve preloads
#                it: tritonserver's memory stays flat over model reloads); part of make setup
#   make test-container   build the CPU image (docker/Dockerfile.cpu) and test it running (root; installs docker.io)
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
HTTP_PORT ?= 8000
GRPC_PORT ?= 8001
METRICS_PORT ?= 8002
# every interface, as Triton binds by default; HOST=127.0.0.1 keeps the server on this machine
HOST ?= 0.0.0.0
# cpu, cuda (text_embedding on the GPU: torch fp16, CUDA graphs, KIND_GPU instances) or auto (cuda when torch sees a GPU)
DEVICE ?= cpu
ARTIFACT := model_repository/text_embedding/1/model.onnx model_repository/text_embedding/1/model.fp16.safetensors model_repository/text_detection/1/model.onnx
# text_embedding version 2: INT8 QDQ behind the accuracy gate (about 2 minutes on 2 cores) and its bf16 weights for
# the torch runtime (the GPU configuration's second version); make test builds them. A version 2 without the bf16
# file gets it added, not quantized again (`fastpath build --if-missing --int8`)
INT8_ARTIFACT := model_repository/text_embedding/2/model.onnx model_repository/text_embedding/2/model.bf16.safetensors
PYTEST_ARGS ?=

.PHONY: setup perf-analyzer tcmalloc artifacts artifacts-int8 lint serve test test-container clean

$(BIN)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[build,test]'
	touch $@

# perf_analyzer ships in the tritonclient 2.51.0 wheel; its libcudart.so.12 and libb64.so.0d go to .venv/lib/perf_analyzer
PERF_ANALYZER := $(VENV)/lib/perf_analyzer/.installed

$(PERF_ANALYZER): $(BIN)/.installed scripts/install_perf_analyzer.sh
	bash scripts/install_perf_analyzer.sh $(VENV)
	touch $@

perf-analyzer: $(PERF_ANALYZER)

TCMALLOC := $(VENV)/lib/tcmalloc/libtcmalloc_minimal.so.4

$(TCMALLOC): $(BIN)/.installed scripts/install_tcmalloc.sh
	bash scripts/install_tcmalloc.sh $(VENV)

tcmalloc: $(TCMALLOC)

setup: $(BIN)/.installed $(PERF_ANALYZER) $(TCMALLOC)

# grouped target (GNU make >= 4.3): one build for all three files, not one per out-of-date file
$(ARTIFACT) &: $(BIN)/.installed
	$(BIN)/fastpath build --if-missing

artifacts: $(ARTIFACT)

$(INT8_ARTIFACT) &: $(ARTIFACT)
	$(BIN)/fastpath build --if-missing --int8

artifacts-int8: $(INT8_ARTIFACT)

# exec: the recipe's shell (make runs it through /bin/sh -c) becomes fastpath serve, so the SIGTERM make forwards
# to its child reaches it and it stops tritonserver; without exec only the shell died, leaving both running
serve: setup artifacts artifacts-int8
	exec $(BIN)/fastpath serve --host $(HOST) --http-port $(HTTP_PORT) --grpc-port $(GRPC_PORT) --metrics-port $(METRICS_PORT) --device $(DEVICE)

lint: $(BIN)/.installed
	$(BIN)/ruff check .

test: setup lint artifacts artifacts-int8
	$(BIN)/python -m pytest $(PYTEST_ARGS)

# Builds the debootstrap base and the CPU image, then runs it: requests, live swap, SIGTERM, read-only, probes,
# Prometheus on every dashboard and adapter query (tests/container; needs root for apt-get, dockerd, debootstrap)
test-container: setup artifacts artifacts-int8
	$(BIN)/python -m pytest tests/container -p no:cacheprovider -rs --timeout=1800 $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) model_repository/*/*/*.onnx model_repository/*/*/*.onnx.data model_repository/*/*/tokenizer.json model_repository/*/*/manifest.json model_repository/*/*/*.safetensors
