"""A request's fields win over the server defaults; unsent fields take them."""

from minivllm.protocol import to_sampling_params


def test_server_default_applies_when_the_request_omits_a_field():
    params = to_sampling_params({"temperature": 0.0, "top_p": None}, {"temperature": 0.7, "top_p": 0.9})
    assert params["temperature"] == 0.0 and params["top_p"] == 0.9
