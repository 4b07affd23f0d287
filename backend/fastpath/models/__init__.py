"""The served models, one folder each (``text_embedding``, ``text_detection``), every folder alike:

    config.py     the model's ``config.pbtxt`` parameters and its scheduler config (frozen dataclasses, a
                  parameter the model does not use refused)
    pipeline.py   inputs -> outputs with an engine, independent of Triton (in-process use and tests)
    batches.py    the scheduler's batch handler: stage a batch into the staging pool, run, deliver rows
    model.py      a ``fastpath.triton.scheduled.ScheduledModel`` subclass (its tensors, load, batch handler,
                  policy, warm-up, execute), the ``TritonPythonModel`` the model.py shim re-exports

plus what only that model needs (text_embedding: versions and golden checks; text_detection: image
decoding, DB post-processing, the GPU batch handler, the memory budget).
"""
