"""The tritonserver process FastPath runs: start/stop, cleanup of what Triton leaves behind, stub supervision,
and the client of Triton's repository and health HTTP API."""
