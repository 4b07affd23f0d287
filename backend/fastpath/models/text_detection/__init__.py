"""``text_detection``: PP-OCRv4 det (DB) text detection, the large-tensor image path.

    config          typed ``config.pbtxt`` parameters
    image           request decoding (PNG/JPEG bytes, UINT8 arrays)
    preprocess      resize policy and normalization
    db_postprocess  DB boxes from the probability map
    pipeline        preprocess + engine + postprocess, independent of Triton
    batches         the scheduler's batch handler: stages images into the pinned pool
    model           the ``TritonPythonModel`` adapter
"""

import os

# OpenCV's pthreads pool (opencv_threads 0) reads these once, when cv2 loads, so they are set before any module of
# this package imports it: between calls its workers sleep instead of spinning (OpenCV's defaults spin 2000 and
# 10000 iterations per wait). With the spinning defaults the pool held ~3.8 cores per stub at c=64 while the decode
# and post-processing threads already ran images in parallel (docs/benchmarks/detection_gpu_h100.md). A variable
# already in the environment wins.
OPENCV_POOL_NO_SPIN = {"OPENCV_THREAD_POOL_ACTIVE_WAIT_PAUSE_LIMIT": "0", "OPENCV_THREAD_POOL_ACTIVE_WAIT_WORKER": "0",
                       "OPENCV_THREAD_POOL_ACTIVE_WAIT_MAIN": "0"}
# OpenCV's warnings about a request's bytes ("PNG input buffer is incomplete" for a truncated file) reach the
# server log without a model or request; the request's own error names its element, so only OpenCV's errors log.
OPENCV_LOG = {"OPENCV_LOG_LEVEL": "ERROR"}
for _name, _value in {**OPENCV_POOL_NO_SPIN, **OPENCV_LOG}.items():
    os.environ.setdefault(_name, _value)
