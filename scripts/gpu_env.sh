# Device machine, sourced after scripts/gpu_setup.sh by the benchmarks/gpu/*.sh runners: where set-up put
# tritonserver (from the nvidia-pytriton wheel) and perf_analyzer with its two libraries.
export FASTPATH_TRITON_DIR=/tmp/g/pytriton/tritonserver PERF_ANALYZER=/tmp/pa/perf_analyzer FASTPATH_PA_LIBS=/tmp/pa/lib PYTHONUNBUFFERED=1
