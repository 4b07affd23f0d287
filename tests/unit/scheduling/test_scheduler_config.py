"""EmbeddingSchedulerConfig and parse_sections: one model's parameters split over two config classes."""

from __future__ import annotations

import pytest

from fastpath.config import parse_parameters, parse_sections
from fastpath.errors import ConfigError
from fastpath.models.text_embedding.config import EmbeddingSchedulerConfig, TextEmbeddingConfig
from fastpath.scheduling import ExactShapePolicy, LengthBucketPolicy


def test_defaults_work_untuned():
    config = parse_parameters(EmbeddingSchedulerConfig, {})
    assert config.batch_buckets == (1, 2, 4, 8, 16, 32, 64)
    assert config.max_queue_delay_us == 2000 and config.max_queue_texts == 1024
    assert config.default_timeout_us == 0 and config.priority_levels == 0


def test_sections_route_each_key_to_its_class():
    model, scheduler = parse_sections(
        {"max_seq_length": "128", "batch_buckets": "1,2,4", "max_queue_delay_us": "500"},
        TextEmbeddingConfig, EmbeddingSchedulerConfig,
    )
    assert model.max_seq_length == 128
    assert scheduler.batch_buckets == (1, 2, 4) and scheduler.max_queue_delay_us == 500


def test_unknown_key_is_named_with_every_known_parameter():
    with pytest.raises(ConfigError, match=r"unknown config.pbtxt parameter 'max_queue_delay'.*max_queue_delay_us.*max_seq_length"):
        parse_sections({"max_queue_delay": "5"}, TextEmbeddingConfig, EmbeddingSchedulerConfig)


@pytest.mark.parametrize(
    ("key", "value", "match"),
    [
        ("batch_buckets", "2,4,8", "starting at 1"),
        ("batch_buckets", "1,4,2", "strictly increasing"),
        ("max_queue_texts", "8", "largest batch bucket"),
        ("max_queue_delay_us", "-1", ">= 0"),
        ("cost_ewma_alpha", "0", r"in \(0, 1\]"),
        ("min_padding_gain", "0.9", ">= 1.0"),
        ("default_priority_level", "3", "1..priority_levels"),
        ("warmup", "maybe", "not a valid bool"),
        ("cancel_check_after_us", "-5", r">= 0 \(0 = ask every request\)"),
    ],
)
def test_bad_values_name_key_and_expectation(key, value, match):
    with pytest.raises(ConfigError, match=match) as info:
        parse_parameters(EmbeddingSchedulerConfig, {key: value})
    assert key in str(info.value)


def test_priority_levels_need_a_default_level_in_range():
    config = parse_parameters(EmbeddingSchedulerConfig, {"priority_levels": "3", "default_priority_level": "2"})
    assert (config.priority_levels, config.default_priority_level) == (3, 2)
    with pytest.raises(ConfigError, match="default_priority_level"):
        parse_parameters(EmbeddingSchedulerConfig, {"priority_levels": "3"})


def test_metrics_false_gives_an_observer_that_publishes_nothing():
    """metrics=false: no MetricFamily is created (pb_utils is never touched), the scheduler gets a no-op observer."""
    from fastpath.scheduling import SchedulerObserver
    from fastpath.triton.scheduled import scheduler_metrics

    _, sched = parse_sections({"metrics": "false", "response_mode": "return"}, TextEmbeddingConfig, EmbeddingSchedulerConfig)
    assert sched.metrics is False and sched.response_mode == "return"
    observer = scheduler_metrics(None, {"model_version": "1"}, sched, "text_embedding", (1, 2, 4))
    assert type(observer) is SchedulerObserver
    with pytest.raises(ConfigError, match="'response_mode' = 'later': expected one of sender, return"):
        parse_sections({"response_mode": "later"}, TextEmbeddingConfig, EmbeddingSchedulerConfig)


def test_policy_and_runner_options_convert_every_microsecond_parameter_to_seconds():
    """Invariant: each *_us parameter reaches the batch policy and runner as the same duration in seconds (x 1e-6)."""
    sched = EmbeddingSchedulerConfig(max_queue_delay_us=2500, deadline_margin_us=700, stage_lead_us=300, cancel_check_after_us=40,
                            batch_buckets=(1, 2, 8), min_padding_gain=1.25, cost_ewma_alpha=0.5, check_cancellation=False)
    options = sched.policy_options()
    assert options["max_queue_delay_s"] == pytest.approx(2.5e-3) and options["deadline_margin_s"] == pytest.approx(7e-4)
    assert (options["min_padding_gain"], options["costs"].alpha) == (1.25, 0.5)
    assert options["costs"] is not sched.policy_options()["costs"]  # each queue learns its own costs
    assert sched.runner_options() == {"stage_lead_s": pytest.approx(3e-4), "check_cancellation": False,
                                      "cancel_check_after_s": pytest.approx(4e-5)}
    sizes = sched.batch_sizes(max_rows=8, max_rows_name="max_batch_texts")
    assert sizes == (1, 2, 8) and sizes.largest == 8
    # the options are the cost-rule policies' own keywords
    LengthBucketPolicy(**options, batch_sizes=sizes, length_buckets=(16, 256))
    ExactShapePolicy(**options, batch_sizes=sizes)


CAPTURED = (1, 2, 4, 8, 16, 32, 64)  # powers of two: what text_embedding's GPU engine captures at max_batch_texts 64


def test_batch_buckets_outside_the_engines_captured_sizes_are_refused_naming_value_and_expectation():
    """Invariant: every scheduler batch size is one the engine runs as it is. Where the engine captured
    batch sizes (CUDA graphs), batch_buckets must be a subset of them (a batch of 3 would otherwise be
    padded again to 4 by the engine); an engine that runs any size takes any batch_buckets up to its limit."""
    odd = parse_parameters(EmbeddingSchedulerConfig, {"batch_buckets": "1,3,6"})  # passes the config's own checks
    with pytest.raises(ConfigError, match=r"'batch_buckets' = 1,3,6: 3, 6 are not among the sizes the engine captured "
                                          r"\(1,2,4,8,16,32,64\), so a batch of 3 would be padded again to 4; use a subset"):
        odd.batch_sizes(max_rows=64, max_rows_name="max_batch_texts", captured=CAPTURED)
    assert odd.batch_sizes(max_rows=64, max_rows_name="max_batch_texts") == (1, 3, 6)  # any size runs as it is
    subset = parse_parameters(EmbeddingSchedulerConfig, {"batch_buckets": "1,2,4"})
    assert subset.batch_sizes(max_rows=64, max_rows_name="max_batch_texts", captured=CAPTURED) == (1, 2, 4)
    with pytest.raises(ConfigError, match=r"'batch_buckets' = \(1, 2, 4\): its largest bucket exceeds max_batch_images=2; "
                                          "drop the larger buckets or raise max_batch_images"):
        subset.batch_sizes(max_rows=2, max_rows_name="max_batch_images")
