"""`gpupool bench counts`' arithmetic, without a platform: subjects folded, the idle background taken off at its
rate, per-job sums per database and per kind of message, and the section it writes."""

from __future__ import annotations

from collections import Counter

import pytest

from libs.bench.counts import BEGIN, DELIVERED, END, Counts, markdown, median_of, subject_class, summary


@pytest.mark.parametrize(("subject", "folded"), [
    ("_INBOX_queue.AbC.7", "_INBOX_queue.*"),
    ("$JS.ACK.GPUPOOL_EVENTS.accounting.1.2.3.4.5.6.7", "$JS.ACK.GPUPOOL_EVENTS.accounting.*"),
    ("gpupool.telemetry.c1.n3", "gpupool.telemetry.*"),
    ("gpupool.rollup.c1.n3", "gpupool.rollup.*"),
    ("$KV.leases.placement", "$KV.leases.*"),
    ("gpupool.job.submitted", "gpupool.job.submitted"),
    ("$JS.API.CONSUMER.MSG.NEXT.GPUPOOL_EVENTS.queue", "$JS.API.CONSUMER.MSG.NEXT.GPUPOOL_EVENTS.queue"),
])
def test_per_message_parts_of_a_subject_are_folded(subject: str, folded: str) -> None:
    assert subject_class(subject) == folded


def test_the_idle_rate_is_taken_off_over_the_window_and_never_below_zero() -> None:
    idle = Counts(10.0, Counter({("queue", "SELECT 1"): 20}), Counter({"gpupool.telemetry.*": 40}))
    jobs = Counts(5.0, Counter({("queue", "SELECT 1"): 30, ("queue", "COMMIT"): 7}),
                  Counter({"gpupool.telemetry.*": 10, "gpupool.job.submitted": 3}))
    statements, messages = jobs.less(idle)
    assert statements == {("queue", "SELECT 1"): 20.0, ("queue", "COMMIT"): 7.0}  # 30 less 2/s x 5 s
    assert messages == {"gpupool.telemetry.*": 0.0, "gpupool.job.submitted": 3.0}  # 10 less 20: none, not -10


def result() -> dict:
    return {
        "jobs": 2, "admitted": 2, "clients": 1, "window_s": 1.0, "idle_s": 1.0, "http_requests_per_job": 2.0,
        "background_per_s": {"statements": 1.0, "messages": 1.0},
        "statements": [{"db": "queue", "query": "COMMIT", "per_job": 2.0},
                       {"db": "queue", "query": "INSERT INTO inbox (consumer, event_id) VALUES ($1, $2)",
                        "per_job": 1.0},
                       {"db": "queue", "query": "SELECT 1", "per_job": 0.5},
                       {"db": "accounting", "query": "BEGIN", "per_job": 1.0}],
        "messages": {"gpupool.cmd.queue.submit_job": 1.0, "gpupool.job.submitted": 1.0,
                     "gpupool.job.submitted" + DELIVERED: 2.0, "$JS.ACK.GPUPOOL_EVENTS.queue.*": 2.0,
                     "_INBOX_queue.*": 3.0},
    }


def test_the_summary_sums_per_database_and_tells_round_trips_publishes_and_deliveries_apart() -> None:
    s = summary(result())
    assert s["per_db"]["queue"] == {"statements": 3.5, "commits": 2.0, "inbox": 1.0, "rest": 0.5}
    assert s["per_db"]["accounting"] == {"statements": 1.0, "commits": 0.0, "inbox": 0.0, "rest": 0.0}
    assert s["rpc"] == {"gpupool.cmd.queue.submit_job": 1.0}
    assert s["events"] == {"gpupool.job.submitted": 1.0}
    assert s["deliveries"] == {"gpupool.job.submitted": 2.0}
    assert s["jetstream"] == {"$JS.ACK.GPUPOOL_EVENTS.queue.*": 2.0}
    assert s["inboxes"] == {"_INBOX_queue.*": 3.0}


def test_the_section_carries_its_markers_the_command_and_the_totals() -> None:
    text = markdown(result(), "gpupool bench counts --jobs 2")
    assert text.startswith(BEGIN) and text.endswith(END)
    assert "`gpupool bench counts --jobs 2`" in text
    assert "| queue | 3.50 | 2.00 | 1.00 | 0.50 |" in text
    assert "| **all** | **4.50** | **2.00** | **1.00** | **0.50** |" in text
    assert "| `gpupool.job.submitted` | 2.00 |" in text  # the deliveries table


def test_a_comparison_puts_an_earlier_run_beside_this_one() -> None:
    before = result()
    after = result() | {"statements": [{"db": "queue", "query": "COMMIT", "per_job": 1.0}]}
    text = markdown(after, "gpupool bench counts", before=before, before_label="commit abc")
    assert "### Against commit abc" in text
    assert "| queue | 3.50 | 1.00 | 2.00 | 1.00 | 0.50 | 0.00 |" in text
    assert "| accounting | 1.00 | 0.00 | 0.00 | 0.00 | 0.00 | 0.00 |" in text  # gone from the later run: none
    assert "| deliveries to durable consumers | 2.00 | 2.00 |" in text


def test_several_runs_are_their_medians_a_statement_one_run_missed_counting_zero() -> None:
    runs = [result() | {"statements": [{"db": "queue", "query": "COMMIT", "per_job": x}],
                        "messages": {"gpupool.job.submitted": x}} for x in (1.0, 5.0, 2.0)]
    runs[1]["statements"].append({"db": "queue", "query": "SELECT 1", "per_job": 9.0})
    merged = median_of(runs)
    assert merged["runs"] == 3 and merged["admitted"] == 6
    assert {(s["query"], s["per_job"]) for s in merged["statements"]} == {("COMMIT", 2.0), ("SELECT 1", 0.0)}
    assert merged["messages"] == {"gpupool.job.submitted": 2.0}
    assert "3 fresh `gpupool up --unsafe-fast` (per-job figures: medians over them)" in markdown(merged, "c")
