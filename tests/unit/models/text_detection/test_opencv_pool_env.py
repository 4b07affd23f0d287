"""OpenCV's pool waits without spinning, and its warnings stay out of the log, in any process that loads
text_detection, unless the user chose otherwise.

OpenCV reads ``OPENCV_THREAD_POOL_ACTIVE_WAIT_*`` once, when cv2 loads; so the invariant is about the environment cv2
sees: importing ``fastpath.models.text_detection`` (which every module that imports cv2 lives under) sets each to 0,
and a value the user already exported is kept.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

from fastpath.models.text_detection import OPENCV_POOL_NO_SPIN

# In a fresh interpreter: record the three variables at the moment cv2 is first imported (a meta path finder that
# only looks), then load the model module as a stub does; print the record (empty if cv2 never loaded after the hook).
PROBE = """
import importlib.abc, json, os, sys
names = json.loads(sys.argv[1])
seen = {}
class AtCv2Import(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "cv2" and not seen:
            seen.update({n: os.environ.get(n) for n in names})
        return None
assert "cv2" not in sys.modules
sys.meta_path.insert(0, AtCv2Import())
import fastpath.models.text_detection.model
print(json.dumps(seen))
"""


def _seen_by_cv2(env: dict[str, str]) -> dict[str, str]:
    out = subprocess.run([sys.executable, "-c", PROBE, json.dumps(sorted(OPENCV_POOL_NO_SPIN))], env=env,
                         capture_output=True, text=True, check=True, timeout=120)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_every_pool_wait_is_zero_when_the_model_module_loads():
    """Each of the three waits is "0" at the moment the model module first imports cv2 (when OpenCV reads them)."""
    env = {k: v for k, v in os.environ.items() if k not in OPENCV_POOL_NO_SPIN}
    assert _seen_by_cv2(env) == {name: "0" for name in OPENCV_POOL_NO_SPIN}


def test_a_wait_the_user_exported_is_kept():
    """A user's own OPENCV_THREAD_POOL_ACTIVE_WAIT_WORKER survives; the other two still default to "0"."""
    env = {**{k: v for k, v in os.environ.items() if k not in OPENCV_POOL_NO_SPIN}, "OPENCV_THREAD_POOL_ACTIVE_WAIT_WORKER": "2000"}
    seen = _seen_by_cv2(env)
    assert seen["OPENCV_THREAD_POOL_ACTIVE_WAIT_WORKER"] == "2000"
    assert seen["OPENCV_THREAD_POOL_ACTIVE_WAIT_MAIN"] == "0" and seen["OPENCV_THREAD_POOL_ACTIVE_WAIT_PAUSE_LIMIT"] == "0"


def test_opencv_warnings_about_a_requests_bytes_stay_out_of_the_log():
    """Invariant: after the package loads, decoding a truncated PNG writes nothing to stderr (OpenCV's WARN line
    names no model or request; the request's own error names its element), unless the user set OPENCV_LOG_LEVEL."""
    script = ("import fastpath.models.text_detection, cv2, numpy as np\n"
              "ok, png = cv2.imencode('.png', np.full((64, 64, 3), 9, np.uint8))\n"
              "assert cv2.imdecode(np.frombuffer(png.tobytes()[:200], np.uint8), cv2.IMREAD_COLOR) is None\n")
    env = {k: v for k, v in os.environ.items() if k != "OPENCV_LOG_LEVEL"}
    quiet = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True, timeout=120)
    assert "WARN" not in quiet.stderr, quiet.stderr
    loud = subprocess.run([sys.executable, "-c", script], env={**env, "OPENCV_LOG_LEVEL": "WARNING"}, capture_output=True,
                          text=True, check=True, timeout=120)
    assert "PNG input buffer is incomplete" in loud.stderr, loud.stderr
