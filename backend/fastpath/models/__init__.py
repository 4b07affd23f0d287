"""The served models, one folder each (``text_embedding``, ``text_detection``), every folder alike:

    config.py     the model's ``config.pbtxt`` parameters (frozen dataclasses, unknown keys refused)
    pipeline.py   inputs -> outputs with an engine, independent of Triton (in-process use and tests)
    batches.py    the scheduler's batch handler: stage a batch into the staging pool, run, deliver rows
    model.py      the ``TritonPythonModel`` (initialize, execute, finalize) re-exported by the model.py shim

plus what only that model needs (text_embedding: versions and golden checks; text_detection: image
decoding, DB post-processing, the GPU batch handler, the memory budget).
"""
