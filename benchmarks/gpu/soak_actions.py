"""The soak's actions on the served text_embedding (benchmarks/gpu/soak.py): a live swap, a reload through
Triton's repository API with a config override, a killed stub. Each takes the running ``Soak`` and returns the
:class:`soak_checks.Action` it made: call and return times, the serving version ``status`` reported before and after.
"""

from __future__ import annotations

import json
import os
import signal
import time

from soak_checks import Action
from soak_parts import MODEL

RELOAD_PARAMETER = "cancel_check_after_us"  # a reload's harmless change: when a request is asked whether it was cancelled


def swap(soak) -> Action:
    """``fastpath swap`` through the SDK: the version other than the serving one."""
    from fastpath_client import FastPathClientError

    before = soak.version
    target = 2 if before == 1 else 1
    call_s = soak.clock()
    reply: dict = {}
    try:
        reply = soak.admin.swap(MODEL, target, timeout_s=300)
        ok, detail = True, f"to {target}: instances serve {reply.get('active_versions')}"
    except FastPathClientError as exc:
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


def reload(soak) -> Action:
    """Triton's load API with a config override (the admin key's header): new stubs, which must come back on the
    serving version (the serving-version record, docs/design/hot-swap.md)."""
    import tritonclient.http as httpclient
    from tritonclient.utils import InferenceServerException

    from fastpath.server.triton_api import ADMIN_HEADER

    client = httpclient.InferenceServerClient(soak.product.http_url, connection_timeout=600, network_timeout=600)
    before, old = soak.version, {stub.pid for stub in soak.product.stubs()}
    call_s, ok = soak.clock(), True
    try:
        config = reload_config(client.get_model_config(MODEL))
        client.load_model(MODEL, config=json.dumps(config), headers={ADMIN_HEADER: soak.product.admin_key})
        detail = f"{RELOAD_PARAMETER}={config['parameters'][RELOAD_PARAMETER]['string_value']}"
    except InferenceServerException as exc:
        ok, detail = False, " ".join(str(exc).split())[:300]
    return_s = soak.clock()
    new = {stub.pid for stub in soak.product.stubs()} - old
    after = soak.status_version()
    kept = ok and after == before and bool(new)
    return Action(kind="reload", call_s=call_s, return_s=return_s, version_before=before, version_after=after, ok=kept,
                  detail=f"{detail}; {len(new)} new stubs; version {'kept' if after == before else 'CHANGED'}")


def _recovery(soak, pid: int) -> dict | None:
    """The stub supervisor's entry for the stub ``pid`` in ``status`` (``recoveries``), None until there is one."""
    from fastpath_client import FastPathClientError

    try:
        entries = soak.admin.status(MODEL, timeout_s=10).get("recoveries") or []
    except FastPathClientError:
        return None
    return next((entry for entry in entries if entry.get("pid") == pid), None)


def kill(soak) -> Action:
    """SIGKILL one text_embedding stub; return once the stub supervisor has reloaded the model and it answers."""
    from fastpath_client import FastPathClientError

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
            try:
                answered = soak.admin.embed(["The soak's recovery check."]).shape == (1, 384)
            except FastPathClientError:
                answered = False
    return_s = soak.clock()
    soak.load.cut()
    after = soak.status_version()
    outcome = (entry or {}).get("outcome", f"no recovery recorded within {soak.args.recovery_timeout_s:.0f} s")
    served = f", serving again {return_s - call_s:.1f} s after the kill" if answered else ""
    return Action(kind="kill", call_s=call_s, return_s=return_s, version_before=before, version_after=after,
                  ok=answered and after == before, detail=f"stub {victim.instance} pid {victim.pid}: {outcome}{served}; "
                  f"version {'kept' if after == before else 'CHANGED'}")


ACTIONS = {"swap": swap, "reload": reload, "kill": kill}
