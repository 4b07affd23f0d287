"""Live model-version swaps through a double-buffered repository.

    publish   atomic publication of a version directory (staging dir, manifest check, rename)
    slots     two engine slots per model instance: active serves, standby loads/warms/validates, atomic flip
    control   the file-based control plane between the admin model and the serving instances

Design and measurements: docs/design/hot-swap.md.
"""
