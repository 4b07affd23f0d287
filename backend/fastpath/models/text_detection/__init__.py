"""``text_detection``: PP-OCRv4 det (DB) text detection, the large-tensor image path.

    config          typed ``config.pbtxt`` parameters
    image           request decoding (PNG/JPEG bytes, UINT8 arrays)
    preprocess      resize policy and normalization
    db_postprocess  DB boxes from the probability map
    pipeline        preprocess + engine + postprocess, independent of Triton
    batches         the scheduler's batch handler: stages images into the pinned pool
    model           the ``TritonPythonModel`` adapter
"""
