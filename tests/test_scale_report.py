"""Pure helpers of the scale benchmark's report (benchmarks/scale/report.py)."""

from benchmarks.scale.report import markdown_table, ratio, scale_summary


def test_markdown_table_formats_and_marks_unknown() -> None:
    rows = [{"subscriptions": 10, "messages": 2000, "us_per_msg": 41.25, "rss_bytes": 3 * 2**20}]
    rows.append({"subscriptions": 100, "messages": 2000, "us_per_msg": None, "rss_bytes": None})
    table = markdown_table("subscriptions", rows).splitlines()
    assert table[0] == "| subscriptions | published | us/msg published | RSS MiB |"
    assert table[2] == "| 10 | 2,000 | 41.2 | 3.0 |"
    assert table[3] == "| 100 | 2,000 | - | - |"


def test_scale_summary_compares_largest_count_with_lone_topic() -> None:
    target = {
        "topics": [
            {"topics": 1, "rss_per_topic_kib": 900.0, "us_per_msg": 20.0},
            {"topics": 1000, "rss_per_topic_kib": 12.0, "us_per_msg": 22.0},
        ]
    }
    assert scale_summary(target) == {"topics": 1000, "rss_per_topic_kib": 12.0, "publish_vs_lone": 1.1}
    assert scale_summary({"topics": []}) == {}
    assert ratio(1.0, 0.0) is None and ratio(None, 2.0) is None
