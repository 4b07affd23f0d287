"""Reload a model whose python-backend stub died or stopped answering while tritonserver runs on.

Triton 2.51 keeps such a model ready while its requests fail ("Stub process ... is not healthy") or hang, and
never restarts the stub; only unload + load brings it back (docs/known-issues.md). :class:`StubSupervisor`, a
thread of ``fastpath serve``, lists tritonserver's stubs every ``poll_s``: an instance whose stub has been gone
for ``grace_s`` with none in its place while Triton still reports the model version ready has died (a readiness
question Triton leaves unanswered, as a busy server can, is asked again at the next look, never taken for "not
ready", which would leave the dead stub unnoticed for good); one whose
progress record says it stalled (:meth:`~fastpath.triton.progress.ProgressRecord.stalled`) is sent ``SIGUSR1``
(its stacks into Triton's log) and killed. Either way the model is unloaded and loaded again, and the cause is
recorded for ``status`` (:meth:`fastpath.swaps.control.ControlPlane.note_recovery`). The model's other stubs of the
replaced generation are killed ``orphan_drain_s`` after the reload: under load Triton never finishes unloading a
generation whose dead stub held requests, so they would keep their memory until the server stops. More than ``max_reloads``
within ``window_s``, or a failed reload, sets :attr:`StubSupervisor.failure`, and ``fastpath serve`` stops the
server and exits 1 for an orchestrator to restart. :func:`check` is the liveness probe
(``python -m fastpath.server.stubs --check``: a ready model short of stubs, a stalled stub, a failed load).
How a death is told from an unload, and what no supervisor can fix:
docs/deployment.md#health-liveness-and-stalled-models.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from fastpath.server.triton_api import RepositoryApi, add_http_port, unreachable
from fastpath.swaps.control import state_dir
from fastpath.triton.progress import ProgressRecord, progress_path, read_progress

LOG = logging.getLogger(__name__)
STUB_EXECUTABLE = "triton_python_backend_stub"


@dataclasses.dataclass(frozen=True)
class Stub:
    """One python-backend stub process: its pid, model name and version, model instance name, the
    pid of the tritonserver that started it, and its ``model.py``."""

    pid: int
    model: str
    version: str
    instance: str
    server_pid: int = 0
    model_file: str = dataclasses.field(default="", compare=False)


def parse_stub_cmdline(pid: int, argv: list[str]) -> Stub | None:
    """The :class:`Stub` of a process's argument list, or None if it is not a python-backend stub.

    Triton 2.51's stub is started as ``triton_python_backend_stub <repository>/<model>/<version>/model.py
    <shm region> <shm default size> <shm growth size> <parent pid> <python lib dir> <ipc size>
    <instance name> <runtime>`` (python_backend stub_launcher.cc; seen on this machine).
    """
    if len(argv) < 9 or not argv[0].endswith(STUB_EXECUTABLE):
        return None
    model_file = Path(argv[1])
    return Stub(pid, model_file.parent.parent.name, model_file.parent.name, argv[8], int(argv[5]) if argv[5].isdigit() else 0,
                argv[1])


def list_stubs(pids: Iterable[int]) -> list[Stub]:
    """The model instances' python-backend stubs among ``pids`` (e.g. :func:`fastpath.server.process.group_members`
    of tritonserver).

    Left out: the short-lived stub Triton runs for the model itself while loading it (its instance
    name is the model's name; it validates the config and exits). Counted as an instance, every
    load, failed or not, looked like a stub death (seen in a failed reload)."""
    stubs = []
    for pid in pids:
        argv = process_argv(pid)
        stub = parse_stub_cmdline(pid, argv) if argv is not None else None  # None: gone meanwhile
        if stub is not None and stub.instance != stub.model:
            stubs.append(stub)
    return stubs


def process_argv(pid: int) -> list[str] | None:
    """Process ``pid``'s command line from /proc (empty parts dropped), or None when it is gone or unreadable."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return None
    return [part.decode(errors="replace") for part in argv if part]


def stub_progress(stub: Stub) -> ProgressRecord | None:
    """The progress record ``stub`` publishes (:mod:`fastpath.triton.progress`), under the state
    directory of the stub's own environment (``FASTPATH_STATE_DIR``, else the default for its model
    repository); None when there is none (not a scheduled FastPath model, still loading, ``stall_timeout_s`` 0)."""
    try:
        environ = Path(f"/proc/{stub.pid}/environ").read_bytes().split(b"\0")
    except OSError:  # gone, or another user's
        return None
    explicit = [entry.split(b"=", 1)[1] for entry in environ if entry.startswith(b"FASTPATH_STATE_DIR=")]
    if explicit:
        root = Path(os.fsdecode(explicit[0]))
    elif stub.model_file:
        root = state_dir(Path(stub.model_file).parent.parent.parent)
    else:
        return None
    record = read_progress(progress_path(root, stub.model, stub.instance, stub.pid))
    return record if record is not None and record.pid == stub.pid else None


class StubSupervisor(threading.Thread):
    """Watches tritonserver's python-backend stubs and reloads a model whose stub died or stalled (module docstring).

    Args:
        stubs: returns the live stubs now (e.g. ``lambda: list_stubs(group_members(server.pid))``).
        api: Triton's HTTP API (:class:`RepositoryApi`, or anything with ``is_ready`` and ``reload``).
        poll_s: seconds between looks at the stubs.
        grace_s: how long an instance may have no stub before it counts as dead (a reload's new stub
            and Triton's own bookkeeping both happen within it).
        max_reloads, window_s: at most this many reloads of one model within ``window_s`` seconds;
            beyond that :attr:`failure` is set and the supervisor stops.
        clock: CLOCK_MONOTONIC seconds (injected by tests; progress records use the same clock).
        progress: a stub's progress record (:func:`stub_progress`), None when it publishes none.
        signal_stub: sends a signal to a pid (``os.kill``; injected by tests).
        stack_dump_wait_s: between ``SIGUSR1`` (the stalled stub prints its stacks) and ``SIGKILL``.
        sleep: waits that long (injected by tests).
        orphan_drain_s: after a reload, how long the replaced generation's surviving stubs may finish the
            requests they hold before they are killed (SIGKILL).
        journal: ``journal(model, event)`` records each reload and its cause for the admin ``status``
            (:meth:`fastpath.swaps.control.ControlPlane.note_recovery`); None records nothing.
    """

    def __init__(self, stubs: Callable[[], list[Stub]], api: RepositoryApi, *, poll_s: float = 0.5, grace_s: float = 2.0,
                 max_reloads: int = 3, window_s: float = 600.0, clock: Callable[[], float] = time.monotonic,
                 progress: Callable[[Stub], ProgressRecord | None] = stub_progress,
                 signal_stub: Callable[[int, int], None] = os.kill, stack_dump_wait_s: float = 0.5,
                 sleep: Callable[[float], None] = time.sleep,
                 journal: Callable[[str, dict[str, Any]], None] | None = None, orphan_drain_s: float = 30.0) -> None:
        super().__init__(name="fastpath-stub-supervisor", daemon=True)
        self._stubs, self._api, self._clock, self._progress = stubs, api, clock, progress
        self._signal, self._sleep, self._journal, self.stack_dump_wait_s = signal_stub, sleep, journal, stack_dump_wait_s
        self.poll_s, self.grace_s, self.max_reloads, self.window_s = poll_s, grace_s, max_reloads, window_s
        self._known: dict[tuple[str, str, str], Stub] = {}  # (model, version, instance) -> the last stub seen
        self._missing_since: dict[tuple[str, str, str], float] = {}
        self._reloads: dict[str, list[float]] = {}
        self._unanswered: set[int] = set()  # stubs whose model's readiness Triton did not answer (warned once)
        self.orphan_drain_s = orphan_drain_s
        self._orphans: dict[int, tuple[str, float]] = {}  # pid -> (model, when to kill it): a replaced generation's stubs
        self.killed_orphans: list[int] = []
        self.reloaded: list[str] = []  # models reloaded, in order
        self.failure: str | None = None
        self._stopping = threading.Event()  # not _stop: threading.Thread has its own

    def stop(self) -> None:
        self._stopping.set()

    def start(self) -> None:
        """Take the first look now (the stubs of the models just loaded), then watch from a thread."""
        self.check()
        super().start()

    def run(self) -> None:
        while not self._stopping.wait(self.poll_s) and self.failure is None:
            try:
                self.check()
            except Exception:  # never take fastpath serve down over a failed look
                LOG.exception("stub supervisor: checking the stubs failed")

    def check(self) -> None:
        """One look: record the live stubs, reload the model of a stalled stub, and of any instance whose stub is dead."""
        now = self._clock()
        stubs = self._stubs()
        live = {(stub.model, stub.version, stub.instance): stub for stub in stubs if stub.pid not in self._orphans}
        self._end_orphans({stub.pid for stub in stubs}, now)
        for key in live:
            self._missing_since.pop(key, None)
        self._known.update(live)
        for key, stub in live.items():
            if self.failure is None and key in self._known:  # not if a reload of its model just replaced it
                self._check_progress(stub, now)
        for key, stub in list(self._known.items()):
            if key in live or self.failure is not None:
                continue
            since = self._missing_since.setdefault(key, now)
            if now - since < self.grace_s or (ready := self._ready(stub)) is None:
                continue  # no answer from Triton: the stub stays missing, and the next look asks again
            del self._known[key], self._missing_since[key]
            if ready:  # unloaded models are not ready: nothing to do
                self._recover(stub, now, "died", "its process is gone")

    def _ready(self, stub: Stub) -> bool | None:
        """Whether Triton has ``stub``'s model version ready; None when it did not answer (logged)."""
        try:
            ready = self._api.is_ready(stub.model, stub.version)
        except OSError as exc:  # TimeoutError: a busy or stopping tritonserver
            if stub.pid not in self._unanswered:  # once per stub, not at every look
                self._unanswered.add(stub.pid)
                LOG.warning("stub supervisor: cannot tell whether model '%s' is ready (its stub pid %d is gone or stalled): "
                            "%s; asking again at each look", stub.model, stub.pid, exc)
            return None
        self._unanswered.discard(stub.pid)
        return ready

    def _check_progress(self, stub: Stub, now: float) -> None:
        """Kill ``stub`` and reload its model if its progress record says it stalled while its model is ready."""
        record = self._progress(stub)
        why = record.stalled(now) if record is not None else None
        if why is None or not self._ready(stub):  # not ready, or no answer: the next look checks it again
            return
        LOG.error("model '%s' instance %s (stub pid %d) stopped answering: %s; Triton 2.51 keeps it ready, so its requests "
                  "would hang or fail: printing its threads' stacks into tritonserver's log (SIGUSR1), then killing it "
                  "(SIGKILL)", stub.model, stub.instance, stub.pid, why)
        for signum, wait_s in ((signal.SIGUSR1, self.stack_dump_wait_s), (signal.SIGKILL, 0.0)):
            try:
                self._signal(stub.pid, signum)
            except ProcessLookupError:  # it ended meanwhile: the reload below is due all the same
                break
            self._sleep(wait_s)
        self._recover(stub, now, "stalled", why)

    def _recover(self, stub: Stub, now: float, cause: str, detail: str) -> None:
        """Reload ``stub``'s model after its stub ``cause`` (``died`` or ``stalled``, ``detail`` says how)."""
        recent = [t for t in self._reloads.get(stub.model, []) if now - t < self.window_s] + [now]
        self._reloads[stub.model] = recent
        replaced = []
        for other in [key for key, known in self._known.items() if known.model == stub.model]:
            replaced.append(self._known.pop(other).pid)  # the model's other instances are replaced by the reload too
            self._missing_since.pop(other, None)
        event = {"at": time.time(), "cause": cause, "detail": detail, "instance": stub.instance, "pid": stub.pid,
                 "triton_version": stub.version}
        if len(recent) > self.max_reloads:
            self.failure = (f"the python-backend stub of model '{stub.model}' died or stalled {len(recent)} times within "
                            f"{self.window_s:.0f} s; not reloading it again")
            LOG.error("%s", self.failure)
            self._note(stub.model, {**event, "outcome": f"not reloaded: {self.failure}"})
            return
        LOG.error("the python-backend stub of model '%s' (instance %s, pid %d) %s while Triton kept the model ready; "
                  "Triton 2.51 does not restart it, so every request would fail: reloading '%s'",
                  stub.model, stub.instance, stub.pid, cause, stub.model)
        self._note(stub.model, {**event, "outcome": "reloading"})  # status says so while the model is away
        if self._api.reload(stub.model):
            self.reloaded.append(stub.model)
            for pid in replaced:
                if pid != stub.pid:
                    self._orphans[pid] = (stub.model, self._clock() + self.orphan_drain_s)
            LOG.warning("reloaded model '%s' after its stub %s; it serves its recorded version, else Triton's", stub.model, cause)
            self._note(stub.model, {**event, "outcome": "reloaded"})
        else:  # the server would stay up without the model for good: stop it, so that it is restarted
            self.failure = f"reloading model '{stub.model}' after its python-backend stub {cause} failed; see tritonserver's log"
            LOG.error("%s", self.failure)
            self._note(stub.model, {**event, "outcome": f"reload failed: {self.failure}"})

    def _end_orphans(self, live_pids: set[int], now: float) -> None:
        """Kill the replaced generations' stubs whose drain time is over; forget those that ended on their own."""
        for pid, (model, kill_at) in list(self._orphans.items()):
            if pid not in live_pids:
                del self._orphans[pid]
            elif now >= kill_at:
                del self._orphans[pid]
                LOG.warning("killing stub pid %d of model '%s': its generation was replaced by a reload %.0f s ago and "
                            "Triton 2.51 never finishes unloading a generation whose dead stub held requests",
                            pid, model, self.orphan_drain_s)
                try:
                    self._signal(pid, signal.SIGKILL)
                    self.killed_orphans.append(pid)
                except ProcessLookupError:
                    pass

    def _note(self, model: str, event: dict[str, Any]) -> None:
        if self._journal is not None:
            try:
                self._journal(model, event)
            except OSError as exc:  # the status misses one entry; the reload itself stands
                LOG.warning("recording the reload of model '%s' for its status failed: %s", model, exc)


def expected_stubs(config: dict) -> int:
    """Python-backend stubs Triton runs for a model version of this config: one per model instance
    (KIND_GPU groups: ``count`` per listed GPU; Triton lists them in the config it reports); 0 for
    other backends."""
    if config.get("backend") != "python":
        return 0
    total = 0
    for group in config.get("instance_group") or [{"count": 1}]:
        count = int(group.get("count", 1))
        total += count * max(1, len(group.get("gpus") or [])) if group.get("kind") == "KIND_GPU" else count
    return total


def check(api: RepositoryApi, stubs: list[Stub], progress: Callable[[Stub], ProgressRecord | None] = stub_progress,
          now_s: float | None = None) -> list[str]:
    """What is wrong, one line per model version that failed to load (Triton's index: UNAVAILABLE with
    a reason other than "unloaded"; e.g. the reload after a stub death failed), per ready
    python-backend model version with fewer live stubs than instances (e.g. "text_embedding version
    1: 0 of 1 python-backend stubs alive"), and per stub of a ready model whose ``progress`` record
    says it stalled at ``now_s`` (CLOCK_MONOTONIC seconds; default now); empty when all is well.

    Raises:
        OSError: Triton did not answer.
    """
    alive: dict[tuple[str, str], int] = {}
    for stub in stubs:
        alive[(stub.model, stub.version)] = alive.get((stub.model, stub.version), 0) + 1
    problems = [f"{entry['name']} version {entry.get('version', '?')} failed to load: {entry.get('reason', '')[:300]}"
                for entry in api.index() if entry.get("state") == "UNAVAILABLE" and entry.get("reason") not in (None, "", "unloaded")]
    ready = api.ready_models()
    for model, version in ready:
        expected = expected_stubs(api.config(model, version))
        if alive.get((model, version), 0) < expected:
            problems.append(f"{model} version {version}: {alive.get((model, version), 0)} of {expected} python-backend "
                            "stubs alive (Triton 2.51 reports it ready but fails every request)")
    now_s = time.monotonic() if now_s is None else now_s
    for stub in stubs:
        record = progress(stub) if (stub.model, stub.version) in ready else None
        why = record.stalled(now_s) if record is not None else None
        if why is not None:
            problems.append(f"{stub.model} version {stub.version} instance {stub.instance} (stub pid {stub.pid}) stopped "
                            f"answering: {why}")
    return problems


def all_processes() -> list[int]:
    """Every process id this process can see (a container's own processes)."""
    return [int(entry.name) for entry in Path("/proc").iterdir() if entry.name.isdigit()]


def _is_tritonserver(pid: int) -> bool:
    """Whether process ``pid`` runs a tritonserver binary (its command line's program name)."""
    argv = process_argv(pid)
    return bool(argv) and Path(argv[0]).name == "tritonserver"


def main(argv: list[str] | None = None) -> int:
    """``python -m fastpath.server.stubs --check``: exit 0 when every ready python-backend model has all its
    stubs and none has stalled, 1 (and a line per problem on stderr) when not or when Triton does not answer. For
    container liveness probes. The admin key (the index is part of the restricted repository API) comes from
    ``FASTPATH_ADMIN_KEY``, else from the file `fastpath serve` wrote for the port (``find_admin_key``)."""
    parser = argparse.ArgumentParser(prog="python -m fastpath.server.stubs", description=main.__doc__)
    parser.add_argument("--check", action="store_true", required=True, help="check once and exit")
    add_http_port(parser)
    parser.add_argument("--server-pid", type=int, help="the tritonserver whose stubs count (needed when "
                        "this process sees stubs of several servers; a container has one)")
    args = parser.parse_args(argv)
    api = RepositoryApi.from_environment(args.http_port)
    stubs = list_stubs(all_processes())
    servers = {stub.server_pid for stub in stubs}
    if args.server_pid is not None:
        if not _is_tritonserver(args.server_pid):  # else every model would read "0 of N stubs alive"
            print(f"--server-pid {args.server_pid} is not a running tritonserver (the ones running stubs: "
                  f"{sorted(servers) or 'none'}); pass the one listening on port {args.http_port}", file=sys.stderr)
            return 1
        stubs = [stub for stub in stubs if stub.server_pid == args.server_pid]
    elif len(servers) > 1:
        print(f"stubs of {len(servers)} tritonservers are running (pids {sorted(servers)}); pass --server-pid", file=sys.stderr)
        return 1
    try:
        problems = check(api, stubs)
    except OSError as exc:
        problems = [unreachable(args.http_port, exc)]
    for problem in problems:
        print(problem, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
