"""Triton python-backend entry point for fastpath_admin: swap, rollback, status, versions."""

from fastpath.triton.admin import AdminModel as TritonPythonModel  # noqa: F401
