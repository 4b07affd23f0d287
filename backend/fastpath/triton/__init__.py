"""Python-backend plumbing the scheduled models share (the models themselves live in ``fastpath.models``).

The ``ScheduledModel`` base both models subclass (``scheduled.py``: initialize/finalize wiring), request
options and answers (``requests.py``), tensor specs checked against config.pbtxt and reading request
tensors (``io.py``), metrics on Triton's
port (``metrics.py``, ``pool_metrics.py``), liveness progress and the heartbeat (``progress.py``,
``heartbeat.py``), the stub's logging (``logs.py``), the load-time numpy self-test (``selftest.py``), the
orphaned-stub watchdog (``watchdog.py``) and the admin model (``admin.py``).

``triton_python_backend_utils`` exists only inside the python-backend stub, so modules here import
it lazily; the rest of FastPath is importable (and testable) without Triton.
"""
