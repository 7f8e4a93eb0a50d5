"""The traffic profile says how bursty arrivals are; that (or a missing histogram) makes sizing arrival-driven."""

import pytest
from pydantic import ValidationError

from fleetcast.plan.traffic import ConsumerTraffic

BASE = {"region": "ap-northeast-2", "rate_rps": [10.0] * 24, "input_tokens": 256, "output_tokens": 128}


def test_a_histogram_only_profile_keeps_the_histogram_method():
    t = ConsumerTraffic.model_validate({**BASE, "concurrency": {"1-16": 1.0}})
    assert not t.arrival_driven
    assert t.hourly_burstiness() == [1.0] * 24


def test_burstiness_makes_sizing_arrival_driven_one_number_or_24():
    assert ConsumerTraffic.model_validate({**BASE, "burstiness": 1.5}).hourly_burstiness() == [1.5] * 24
    hourly = [1.0 + h / 24 for h in range(24)]
    t = ConsumerTraffic.model_validate({**BASE, "burstiness": hourly, "concurrency": {"8": 1.0}})
    assert t.arrival_driven and t.hourly_burstiness() == hourly
    assert ConsumerTraffic.model_validate(BASE).arrival_driven  # no histogram: arrivals are all there is


@pytest.mark.parametrize("bad", [0.5, [1.2] * 23, 100.0])
def test_burstiness_out_of_range_is_refused_naming_the_rule(bad):
    with pytest.raises(ValidationError, match="burstiness|hourly values"):
        ConsumerTraffic.model_validate({**BASE, "burstiness": bad})
