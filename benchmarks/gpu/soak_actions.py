"""The soak's actions on the served text_embedding (benchmarks/gpu/soak.py): a live swap, a reload through
Triton's repository API with a config override, a killed stub. Each takes the running ``Soak`` and returns the
:class:`soak_checks.Action` it made: call and return times, the serving version ``status`` reported before and after.
"""

from __future__ import annotations

import json
import os
import signal
import time
import urllib.error
import urllib.request

from soak_checks import Action
from soak_parts import MODEL, one_text

RELOAD_PARAMETER = "cancel_check_after_us"  # a reload's harmless change: when a request is asked whether it was cancelled


def swap(soak) -> Action:
    """A live swap (``fastpath_admin``, as ``fastpath swap``) to the version other than the serving one."""
    from tritonclient.utils import InferenceServerException

    before = soak.version
    target = 2 if before == 1 else 1
    call_s = soak.clock()
    reply: dict = {}
    try:
        reply = soak.admin.swap(target)
        ok, detail = True, f"to {target}: instances serve {reply.get('active_versions')}"
    except InferenceServerException as exc:
        ok, detail = False, f"to {target}: {' '.join(str(exc).split())[:300]}"
    return_s = soak.clock()
    after = soak.status_version()
    if after is None and reply.get("active_version") is not None:  # status failed: the swap's reply says what serves
        after, detail = reply["active_version"], detail + " (status failed: version from the swap's reply)"
    return Action(kind="swap", call_s=call_s, return_s=return_s, version_before=before, version_after=after,
                  ok=ok and after == target, detail=detail)


def reload_config(config: dict) -> dict:
    """``config`` (Triton's JSON of the loaded model) with :data:`RELOAD_PARAMETER` one microsecond more than it
    has (or than FastPath's default): Triton 2.51 treats a load whose override equals the loaded config as done."""
    from fastpath.scheduling.config import SchedulerConfig

    parameters = config.setdefault("parameters", {})
    current = parameters.get(RELOAD_PARAMETER, {}).get("string_value", SchedulerConfig().cancel_check_after_us)
    parameters[RELOAD_PARAMETER] = {"string_value": str(int(current) + 1)}
    return config


def load_with_config(http_url: str, admin_key: str, config: dict, timeout_s: float = 600.0) -> None:
    """Triton's load API (``POST /v2/repository/models/<model>/load``) with ``config`` as the override, sending the
    admin key's header (``fastpath serve`` restricts the repository API to it).

    Raises:
        OSError: Triton refused (urllib's HTTPError, with Triton's message) or did not answer.
    """
    from fastpath.server.triton_api import ADMIN_HEADER

    body = json.dumps({"parameters": {"config": json.dumps(config)}}).encode()
    request = urllib.request.Request(f"http://{http_url}/v2/repository/models/{config['name']}/load", data=body, method="POST",
                                     headers={ADMIN_HEADER: admin_key, "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout_s):
            pass
    except urllib.error.HTTPError as exc:
        raise OSError(f"HTTP {exc.code}: {exc.read().decode(errors='replace')[:300]}") from exc


def reload(soak) -> Action:
    """Triton's load API with a config override: new stubs, which must come back on the serving version (the
    serving-version record, docs/design/hot-swap.md)."""
    from fastpath.server.triton_api import RepositoryApi

    before, old = soak.version, {stub.pid for stub in soak.product.stubs()}
    call_s, ok = soak.clock(), True
    try:
        config = reload_config(RepositoryApi(soak.product.http_url).config(MODEL, "1"))
        load_with_config(soak.product.http_url, soak.product.admin_key, config)
        detail = f"{RELOAD_PARAMETER}={config['parameters'][RELOAD_PARAMETER]['string_value']}"
    except OSError as exc:
        ok, detail = False, " ".join(str(exc).split())[:300]
    return_s = soak.clock()
    new = {stub.pid for stub in soak.product.stubs()} - old
    after = soak.status_version()
    return Action(kind="reload", call_s=call_s, return_s=return_s, version_before=before, version_after=after,
                  ok=ok and after == before and bool(new),
                  detail=f"{detail}; {len(new)} new stubs; version {'kept' if after == before else 'CHANGED'}")


def _recovery(soak, pid: int) -> dict | None:
    """The stub supervisor's entry for the stub ``pid`` in ``status`` (``recoveries``), None until there is one."""
    from tritonclient.utils import InferenceServerException

    try:
        entries = soak.admin.status().get("recoveries") or []
    except InferenceServerException:
        return None
    return next((entry for entry in entries if entry.get("pid") == pid), None)


def kill(soak) -> Action:
    """SIGKILL one text_embedding stub; return once the stub supervisor has reloaded the model and it answers."""
    import tritonclient.grpc as grpcclient

    stubs = sorted(soak.product.stubs(), key=lambda stub: stub.instance)
    before = soak.version
    if not stubs:
        now = soak.clock()
        return Action(kind="kill", call_s=now, return_s=now, version_before=before, version_after=before, ok=False,
                      detail="no text_embedding stub to kill")
    victim = stubs[0]
    call_s = soak.clock()
    os.kill(victim.pid, signal.SIGKILL)
    deadline_s, entry, answered = call_s + soak.args.recovery_timeout_s, None, False
    while soak.clock() < deadline_s and not answered:
        time.sleep(0.5)
        entry = _recovery(soak, victim.pid)
        if entry is not None and entry.get("outcome") != "reloaded":
            break  # the supervisor gave up: fastpath serve stops the server
        if entry is not None:
            answered = one_text(grpcclient.InferenceServerClient(soak.product.grpc_url), "The soak's recovery check.")[1] is None
    return_s = soak.clock()
    soak.load.cut()
    after = soak.status_version()
    outcome = (entry or {}).get("outcome", f"no recovery recorded within {soak.args.recovery_timeout_s:.0f} s")
    served = f", serving again {return_s - call_s:.1f} s after the kill" if answered else ""
    return Action(kind="kill", call_s=call_s, return_s=return_s, version_before=before, version_after=after,
                  ok=answered and after == before, detail=f"stub {victim.instance} pid {victim.pid}: {outcome}{served}; "
                  f"version {'kept' if after == before else 'CHANGED'}")


ACTIONS = {"swap": swap, "reload": reload, "kill": kill}
