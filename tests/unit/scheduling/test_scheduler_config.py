"""SchedulerConfig and parse_sections: one model's parameters split over two config classes."""

from __future__ import annotations

import pytest

from fastpath.config import parse_parameters, parse_sections
from fastpath.errors import ConfigError
from fastpath.models.text_embedding.config import TextEmbeddingConfig
from fastpath.scheduling import BatchQueue
from fastpath.scheduling.config import SchedulerConfig


def test_defaults_work_untuned():
    config = parse_parameters(SchedulerConfig, {})
    assert config.batch_buckets == (1, 2, 4, 8, 16, 32, 64)
    assert config.max_queue_delay_us == 2000 and config.max_queue_texts == 1024
    assert config.default_timeout_us == 0 and config.priority_levels == 0


def test_sections_route_each_key_to_its_class():
    model, scheduler = parse_sections(
        {"max_seq_length": "128", "batch_buckets": "1,2,4", "max_queue_delay_us": "500"},
        TextEmbeddingConfig, SchedulerConfig,
    )
    assert model.max_seq_length == 128
    assert scheduler.batch_buckets == (1, 2, 4) and scheduler.max_queue_delay_us == 500


def test_unknown_key_is_named_with_every_known_parameter():
    with pytest.raises(ConfigError, match=r"unknown config.pbtxt parameter 'max_queue_delay'.*max_queue_delay_us.*max_seq_length"):
        parse_sections({"max_queue_delay": "5"}, TextEmbeddingConfig, SchedulerConfig)


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
        parse_parameters(SchedulerConfig, {key: value})
    assert key in str(info.value)


def test_priority_levels_need_a_default_level_in_range():
    config = parse_parameters(SchedulerConfig, {"priority_levels": "3", "default_priority_level": "2"})
    assert (config.priority_levels, config.default_priority_level) == (3, 2)
    with pytest.raises(ConfigError, match="default_priority_level"):
        parse_parameters(SchedulerConfig, {"priority_levels": "3"})


def test_metrics_false_gives_an_observer_that_publishes_nothing():
    """metrics=false: no MetricFamily is created (pb_utils is never touched), the scheduler gets a no-op observer."""
    from fastpath.scheduling import SchedulerObserver
    from fastpath.triton.scheduled import scheduler_metrics

    _, sched = parse_sections({"metrics": "false", "response_mode": "return"}, TextEmbeddingConfig, SchedulerConfig)
    assert sched.metrics is False and sched.response_mode == "return"
    observer = scheduler_metrics(None, {"model_version": "1"}, sched, "text_embedding")
    assert type(observer) is SchedulerObserver
    with pytest.raises(ConfigError, match="'response_mode' = 'later': expected one of sender, return"):
        parse_sections({"response_mode": "later"}, TextEmbeddingConfig, SchedulerConfig)


def test_queue_and_runner_options_convert_every_microsecond_parameter_to_seconds():
    """Invariant: each *_us parameter reaches the queue and runner as the same duration in seconds (x 1e-6)."""
    sched = SchedulerConfig(max_queue_delay_us=2500, deadline_margin_us=700, stage_lead_us=300, cancel_check_after_us=40,
                            batch_buckets=(1, 2, 8), min_padding_gain=1.25, cost_ewma_alpha=0.5, check_cancellation=False)
    queue = sched.queue_options()
    assert queue["max_queue_delay_s"] == pytest.approx(2.5e-3) and queue["deadline_margin_s"] == pytest.approx(7e-4)
    assert (queue["batch_buckets"], queue["min_padding_gain"], queue["costs"].alpha) == ((1, 2, 8), 1.25, 0.5)
    assert queue["costs"] is not sched.queue_options()["costs"]  # each queue learns its own costs
    assert sched.runner_options() == {"stage_lead_s": pytest.approx(3e-4), "check_cancellation": False,
                                      "cancel_check_after_s": pytest.approx(4e-5)}
    BatchQueue(**queue, length_buckets=(16, 256), max_texts=64)  # the options are the queue's own keywords
