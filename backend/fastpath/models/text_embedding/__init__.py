"""``text_embedding``: all-MiniLM-L6-v2 sentence embeddings.

    config     typed ``config.pbtxt`` parameters
    pipeline   tokenize + engine + pooling outputs, independent of Triton
    batches    the scheduler's batch handler: stages token ids into the pinned pool, runs the engine
    versions   the versioned embedder behind live swaps (active and standby engine slots)
    golden     the golden check a version passes before it serves
    model      the ``TritonPythonModel`` adapter
"""
