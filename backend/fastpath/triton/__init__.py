"""The Triton python-backend adapter: ``TritonPythonModel`` classes imported by model.py shims.

``triton_python_backend_utils`` exists only inside the python-backend stub, so modules here import
it lazily; the rest of FastPath is importable (and testable) without Triton.
"""
