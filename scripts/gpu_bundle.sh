#!/usr/bin/env bash
# On this machine: gather everything a GPU run needs on the device machine (which has no network) into one
# tar, cut into parts of 56 MiB, one per device call (a call carries at most 64 MiB with the working tree):
#   triton.txz   tritonserver from the nvidia-pytriton wheel with its libraries (the 3.12 stub only)
#   wheels/      cp312 wheels for the stub's environment: numpy 1.26 (Triton 2.51's stub breaks with numpy 2),
#                onnxruntime-gpu (CUDA 13 build: the CUDA EP for text_detection), OpenCV 4.11 (the last
#                numpy-1 build) and pyclipper (text_detection's DB post-processing), tritonclient 2.51
#                (perf_analyzer inside), python-rapidjson, py-spy, inotify_simple (the swap agent's watch: without
#                it every instance polls for swap commands)
#   pa/          perf_analyzer's two libraries: libcudart.so.12 (nvidia-cuda-runtime-cu12), libb64.so.0d (Debian);
#                Debian's libtcmalloc-minimal4 (fastpath serve preloads tcmalloc into tritonserver)
#   artifacts/   text_embedding/1 (fp16 weights, tokenizer, manifest, golden), text_embedding/2's torch-runtime
#                files (bf16 weights, tokenizer, manifest, golden: `fastpath build --int8`) in text_embedding_2/,
#                and text_detection/1 (model.onnx, model.uint8.onnx, manifest)
#   prev/        backend/ at $PREV_COMMIT (default HEAD), for A/B runs of two versions of the code
#   inputs/      real photos for benchmarks/gpu/served_detection_gpu.py (benchmarks/gpu/detection_inputs.py)
# Result: .device/parts/part-00 .. part-NN. Every call but the last copies its part to /tmp/parts there
# (`mkdir -p /tmp/parts && cp .device/parts/part-NN /tmp/parts/`); the last runs scripts/gpu_setup.sh, which
# joins them. The calls must follow one another within the 30 s the machine stays warm.
# BUNDLE=text: text_embedding's served benchmarks only (no onnxruntime-gpu, OpenCV, pyclipper, text_detection or
# text_embedding/2 files, no photos): three parts instead of nine, in .device/parts_text.
# Run from the repository root after `make`.
set -euo pipefail
PREV_COMMIT=${PREV_COMMIT:-HEAD}
BUNDLE=${BUNDLE:-all}
if [ "$BUNDLE" = text ]; then B=.device/bundle_text P=.device/parts_text; else B=.device/bundle P=.device/parts; fi
rm -rf "$B" "$P" && mkdir -p "$B/wheels" "$B/pa" "$B/artifacts/text_embedding" "$B/prev" "$P"
TRITON=$(.venv/bin/python -c "import pytriton, pathlib; print(pathlib.Path(pytriton.__file__).parent)")
tar -C "$(dirname "$TRITON")" --exclude='python_backend_stubs/3.[0-9]' --exclude='python_backend_stubs/3.1[013]' \
    -cJf "$B/triton.txz" pytriton/tritonserver nvidia_pytriton.libs
PIP="python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
     --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64"
$PIP -d "$B/wheels" numpy==1.26.4 tritonclient==2.51.0 python-rapidjson==1.20 py-spy==0.4.0 inotify_simple==2.0.1
if [ "$BUNDLE" != text ]; then
    $PIP -d "$B/wheels" onnxruntime-gpu==1.31.1 opencv-python-headless==4.11.0.86 pyclipper==1.3.0.post6
fi
$PIP -d "$B/pa" nvidia-cuda-runtime-cu12==12.9.79
(cd "$B/pa" && apt-get download -q libb64-0d libtcmalloc-minimal4 >/dev/null 2>&1)
for name in model.fp16.safetensors tokenizer.json manifest.json golden.npz; do
    cp model_repository/text_embedding/1/$name "$B/artifacts/text_embedding/"
done
git archive "$PREV_COMMIT" backend | tar -x -C "$B/prev"
if [ "$BUNDLE" != text ]; then
    mkdir -p "$B/artifacts/text_embedding_2" "$B/artifacts/text_detection"
    for name in model.bf16.safetensors tokenizer.json manifest.json golden.npz; do
        cp model_repository/text_embedding/2/$name "$B/artifacts/text_embedding_2/"
    done
    for name in model.onnx model.uint8.onnx manifest.json; do
        cp model_repository/text_detection/1/$name "$B/artifacts/text_detection/"
    done
    .venv/bin/python benchmarks/gpu/detection_inputs.py --out "$B/inputs" >/dev/null
fi
tar -C "$B" -cf - . | split -b 56M -d - "$P/part-"
du -sh "$B" && ls "$P"
