from rlrun.inference.throughput import ThroughputMeter


def test_rate_counts_tokens_inside_the_window():
    meter = ThroughputMeter(window_s=10.0)
    assert meter.rate(0.0) == 0.0
    meter.add(0.0, 100)
    meter.add(1.0, 100)
    meter.add(2.0, 100)
    assert meter.rate(2.0) == 100.0
    assert meter.rate(20.0) == 0.0
