# FastPath: two commands from a fresh clone.
#   make serve   set up .venv, build artifacts if missing, run tritonserver with text_embedding
#   make test    the same set-up, then the test suite
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
HTTP_PORT ?= 8000
GRPC_PORT ?= 8001
METRICS_PORT ?= 8002
ARTIFACT := model_repository/text_embedding/1/model.onnx model_repository/text_detection/1/model.onnx
PYTEST_ARGS ?=

.PHONY: setup artifacts serve test clean

$(BIN)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[build,test]'
	touch $@

setup: $(BIN)/.installed

$(ARTIFACT): $(BIN)/.installed
	$(BIN)/fastpath build --if-missing

artifacts: $(ARTIFACT)

serve: artifacts
	HTTP_PORT=$(HTTP_PORT) GRPC_PORT=$(GRPC_PORT) METRICS_PORT=$(METRICS_PORT) $(BIN)/fastpath serve

test: artifacts
	$(BIN)/python -m pytest $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) model_repository/*/*/*.onnx model_repository/*/*/tokenizer.json model_repository/*/*/manifest.json
