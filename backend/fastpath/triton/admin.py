"""``TritonPythonModel`` of ``fastpath_admin``: model-version control through Triton's own endpoints.

Input ``REQUEST`` (TYPE_STRING [1]) holds one JSON command, output ``RESPONSE`` (TYPE_STRING [1]) the
JSON reply; see :class:`fastpath.swaps.admin.AdminService`. No extra port: clients call it with
a normal infer request (HTTP or gRPC). A refused command is a 400 whose message is the reason.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np

from fastpath.errors import InvalidInputError
from fastpath.swaps.admin import AdminService
from fastpath.swaps.control import state_dir
from fastpath.triton.io import error_response, read_input
from fastpath.triton.logs import configure_stub_logging
from fastpath.triton.watchdog import exit_with_server

MAX_REQUEST_BYTES = 64 << 10  # a command is a few hundred bytes; a larger REQUEST is refused before it is parsed


def parse_command(data: bytes) -> dict[str, Any]:
    """The JSON object of one ``REQUEST`` element.

    Raises:
        InvalidInputError: more than :data:`MAX_REQUEST_BYTES`, not UTF-8, not JSON (or nested too deeply to
            parse), or not a JSON object; the message names REQUEST and what is wrong.
    """
    if len(data) > MAX_REQUEST_BYTES:
        raise InvalidInputError(f"REQUEST is {len(data)} bytes; a command is a JSON object of at most {MAX_REQUEST_BYTES} "
                                "bytes, such as {\"command\": \"status\", \"model\": \"text_embedding\"}")
    try:
        document = json.loads(data.decode("utf-8"))
    except RecursionError:
        raise InvalidInputError("REQUEST is not a JSON command: nested too deeply to parse") from None
    except (UnicodeDecodeError, ValueError) as exc:  # json.JSONDecodeError, or an integer too long to convert
        raise InvalidInputError(f"REQUEST is not a UTF-8 JSON document: {exc}") from None
    if not isinstance(document, dict):
        raise InvalidInputError("REQUEST must be a JSON object such as {\"command\": \"status\", \"model\": \"text_embedding\"}")
    return document


class AdminModel:
    """The python-backend model class; ``model_repository/fastpath_admin/1/model.py`` re-exports it."""

    def initialize(self, args: dict[str, str]) -> None:
        import triton_python_backend_utils as pb_utils

        self._pb = pb_utils
        configure_stub_logging()
        exit_with_server()  # a stub orphaned by a crashed or killed tritonserver exits (watchdog.py)
        repository = Path(args["model_repository"]).parent
        self.service = AdminService(repository, state_dir(repository), os.environ.get("FASTPATH_ADMIN_KEY", ""))

    def _handle(self, request: Any) -> Any:
        raw = read_input(self._pb, request, "REQUEST").reshape(-1)
        if raw.size != 1:
            raise InvalidInputError(f"REQUEST has {raw.size} elements; send exactly one JSON command")
        reply = self.service.handle(parse_command(bytes(raw[0])))
        return self._pb.InferenceResponse(
            output_tensors=[self._pb.Tensor("RESPONSE", np.array([json.dumps(reply).encode()], dtype=np.object_))]
        )

    def execute(self, requests: list[Any]) -> list[Any]:
        responses = []
        for request in requests:
            try:
                responses.append(self._handle(request))
            except Exception as exc:  # each command fails alone, with its reason
                responses.append(error_response(self._pb, exc, request.request_id()))
        return responses
