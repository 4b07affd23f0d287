"""The served text_embedding benchmark's model repository (benchmarks/gpu/triton_gpu.py): text_embedding_gpu is
the shipped GPU configuration itself, so a served figure for it is the product's."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks" / "gpu"))

import served_gpu  # noqa: E402
import stub_probes  # noqa: E402
import triton_gpu  # noqa: E402


def test_text_embedding_gpu_is_configs_gpu_pbtxt_with_only_its_name_and_instance_count_changed(tmp_path):
    """Invariant: text_embedding_gpu's config.pbtxt is model_repository/text_embedding/configs/gpu.pbtxt line for
    line, except the model name and the instance group's count (the run's --instances); its version directory
    holds the shipped version 1's model.py."""
    version_dir = ROOT / "model_repository" / "text_embedding" / "1"
    repository = triton_gpu.make_repository(tmp_path, version_dir, device="cuda", precision="fp16", instances=12, delay_us=0)
    triton_gpu.add_variants(repository, version_dir, ["text_embedding_gpu"], device="cuda", precision="fp16", instances=12)
    shipped = (ROOT / "model_repository" / "text_embedding" / "configs" / "gpu.pbtxt").read_text().splitlines()
    served = (repository / "text_embedding_gpu" / "config.pbtxt").read_text().splitlines()
    differing = [(a, b) for a, b in zip(shipped, served) if a != b]
    assert len(shipped) == len(served)
    assert differing == [('name: "text_embedding"', 'name: "text_embedding_gpu"'), ("    count: 6", "    count: 12")]
    assert (repository / "text_embedding_gpu" / "1" / "model.py").is_file()


def test_gpu_config_variants_change_one_parameter_of_the_shipped_config(tmp_path):
    """Invariant: each A/B variant of the shipped GPU configuration (text_embedding_gpu_nometrics, _blocking) is
    configs/gpu.pbtxt with its name, instance count and exactly its one parameter changed: an existing
    parameter line is replaced, a new one appended, and the parameter appears once."""
    version_dir = ROOT / "model_repository" / "text_embedding" / "1"
    repository = triton_gpu.make_repository(tmp_path, version_dir, device="cuda", precision="fp16", instances=6, delay_us=0)
    triton_gpu.add_variants(repository, version_dir, list(triton_gpu.GPU_CONFIG_VARIANTS), device="cuda", precision="fp16", instances=6)
    shipped = (ROOT / "model_repository" / "text_embedding" / "configs" / "gpu.pbtxt").read_text().splitlines()
    for name, parameters in triton_gpu.GPU_CONFIG_VARIANTS.items():
        served = (repository / name / "config.pbtxt").read_text().splitlines()
        ((key, value),) = parameters.items()
        line = f'parameters {{ key: "{key}" value: {{ string_value: "{value}" }} }}'
        assert served.count(line) == 1 and sum(f'key: "{key}"' in row for row in served) == 1
        assert [row for row in served if row not in shipped] == [f'name: "{name}"', line]
        assert [row for row in shipped if row not in served] == ['name: "text_embedding"']  # count: 6 as shipped


def test_text_embedding_gpu_prev_is_the_shipped_config_on_the_other_backend(tmp_path):
    """Invariant: text_embedding_gpu_prev (an A/B of two versions of the code in one server) is text_embedding_gpu's
    config.pbtxt with only the name changed, and its model.py imports fastpath from --prev-backend first; asked for
    alone, no text_embedding_gpu is left in the repository."""
    version_dir = ROOT / "model_repository" / "text_embedding" / "1"
    prev = tmp_path / "prev" / "backend"
    prev.mkdir(parents=True)
    repository = served_gpu.build_repository(tmp_path / "a", version_dir, ["text_embedding_gpu", "text_embedding_gpu_prev"],
                                             instances=6, prev_backend=prev)
    current = (repository / "text_embedding_gpu" / "config.pbtxt").read_text()
    assert (repository / "text_embedding_gpu_prev" / "config.pbtxt").read_text() == current.replace(
        'name: "text_embedding_gpu"', 'name: "text_embedding_gpu_prev"')
    model = (repository / "text_embedding_gpu_prev" / "1" / "model.py").read_text()
    assert model.startswith(f"import sys\nsys.path.insert(0, {str(prev.resolve())!r})\n")
    alone = served_gpu.build_repository(tmp_path / "b", version_dir, ["text_embedding_gpu_prev"], instances=6, prev_backend=prev)
    assert (alone / "text_embedding_gpu_prev").is_dir() and not (alone / "text_embedding_gpu").exists()


def test_with_parameter_replaces_an_existing_line_and_appends_a_new_one():
    """Invariant: with_parameter sets a parameter in config.pbtxt text without duplicating its key."""
    config = 'name: "m"\nparameters { key: "cuda_sync" value: { string_value: "spin" } }\n'
    assert triton_gpu.with_parameter(config, "cuda_sync", "blocking") == \
        'name: "m"\nparameters { key: "cuda_sync" value: { string_value: "blocking" } }\n'
    assert triton_gpu.with_parameter(config, "metrics", "false").splitlines()[-1] == \
        'parameters { key: "metrics" value: { string_value: "false" } }'


def test_py_spy_native_samples_pause_the_stub_and_plain_samples_do_not(tmp_path):
    """Invariant: the served benchmark's py-spy records raw stacks at 250 Hz of the one pid for the whole seconds;
    --native (C/C++ frames) goes without --nonblocking, which py-spy refuses to combine with it, and the plain
    record stays non-blocking so it does not slow the stub it samples."""
    out = tmp_path / "spy.txt"
    plain = stub_probes.py_spy_argv("py-spy", 4242, 8.0, out)
    native = stub_probes.py_spy_argv("py-spy", 4242, 8.0, out, native=True)
    common = ["py-spy", "record", "--rate", "250", "--format", "raw", "--duration", "8", "--output", str(out), "--pid", "4242"]
    assert plain == common + ["--nonblocking"]
    assert native == common + ["--native"]


def test_py_spy_gil_samples_only_the_gil_holder_in_either_mode(tmp_path):
    """Invariant: --py-spy-gil adds py-spy's --gil (one thread unwound per sample, so a thread whose native stack
    cannot be merged no longer drops every sample) and keeps the native/plain choice as it was."""
    out = tmp_path / "spy.txt"
    common = ["py-spy", "record", "--rate", "250", "--format", "raw", "--duration", "8", "--output", str(out), "--pid", "4242"]
    assert stub_probes.py_spy_argv("py-spy", 4242, 8.0, out, native=True, gil=True) == common + ["--gil", "--native"]
    assert stub_probes.py_spy_argv("py-spy", 4242, 8.0, out, gil=True) == common + ["--gil", "--nonblocking"]


def test_reload_memory_variants_name_the_environment_fastpath_serve_starts_with():
    """Invariant: `served` is FASTPATH_MALLOC=tcmalloc, `served,VAR=VALUE,...` adds those variables (tcmalloc's own
    settings), `glibc` is FASTPATH_MALLOC=glibc, and NAME=LIBRARY preloads LIBRARY everywhere under glibc's choice."""
    import reload_memory

    assert reload_memory.variant_environment("served", None) == {"FASTPATH_MALLOC": "tcmalloc"}
    assert reload_memory.variant_environment("served,TCMALLOC_AGGRESSIVE_DECOMMIT=false,TCMALLOC_RELEASE_RATE=10", None) == {
        "FASTPATH_MALLOC": "tcmalloc", "TCMALLOC_AGGRESSIVE_DECOMMIT": "false", "TCMALLOC_RELEASE_RATE": "10"}
    assert reload_memory.variant_environment("glibc", None) == {"FASTPATH_MALLOC": "glibc"}
    assert reload_memory.variant_environment("jemalloc", "/lib/libjemalloc.so.2") == {
        "FASTPATH_MALLOC": "glibc", "LD_PRELOAD": "/lib/libjemalloc.so.2"}


def test_on_cpu_text_embedding_gpu_is_the_shipped_gpu_configuration_on_cpu_instances_at_the_runs_precision(tmp_path):
    """Invariant: with --device cpu, text_embedding_gpu differs from configs/gpu.pbtxt only in its name, its instance
    count, KIND_CPU for KIND_GPU and the run's precision: a CPU machine can serve it (a KIND_GPU instance group
    fails to load without a GPU)."""
    version_dir = ROOT / "model_repository" / "text_embedding" / "1"
    repository = triton_gpu.make_repository(tmp_path, version_dir, device="cpu", precision="fp32", instances=1, delay_us=0)
    triton_gpu.add_variants(repository, version_dir, ["text_embedding_gpu"], device="cpu", precision="fp32", instances=1)
    shipped = (ROOT / "model_repository" / "text_embedding" / "configs" / "gpu.pbtxt").read_text().splitlines()
    served = (repository / "text_embedding_gpu" / "config.pbtxt").read_text().splitlines()
    assert sorted(set(shipped) - set(served)) == sorted(['name: "text_embedding"', "    count: 6", "    kind: KIND_GPU",
                                                          'parameters { key: "precision" value: { string_value: "fp16" } }'])
    assert sorted(set(served) - set(shipped)) == sorted(['name: "text_embedding_gpu"', "    count: 1", "    kind: KIND_CPU",
                                                          'parameters { key: "precision" value: { string_value: "fp32" } }'])


def test_rounds_alternate_which_model_a_cell_measures_first():
    """Invariant: per concurrency, each round runs every model once; odd rounds reverse the order, so over an even
    number of rounds each model is measured first as often as last."""
    order = served_gpu.cell_order(["a", "b"], [1, 64], 2)
    assert order == [(1, 0, "a"), (1, 0, "b"), (1, 1, "b"), (1, 1, "a"), (64, 0, "a"), (64, 0, "b"), (64, 1, "b"), (64, 1, "a")]
    assert served_gpu.cell_order(["a", "b"], [1], 1) == [(1, 0, "a"), (1, 0, "b")]


def test_ratios_divide_by_the_baseline_of_the_same_round_and_cell():
    """Invariants: a ratio is a model's req/s over the baseline's in the same (workload, concurrency, round); the median
    is over rounds; a round without the baseline gives no ratio."""
    rows = [{"workload": "short", "concurrency": 64, "round": r, "model": m, "req_per_s": v}
            for r, m, v in ((0, "fp", 110.0), (0, "sp", 100.0), (1, "sp", 100.0), (1, "fp", 90.0), (2, "fp", 120.0))]
    assert served_gpu.cell_ratios(rows, "sp") == {"short:64": {"fp": {"per_round": [1.1, 0.9], "median": 1.0}}}
    assert served_gpu.cell_ratios(rows, "absent") == {}
