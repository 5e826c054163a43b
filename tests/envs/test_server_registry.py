"""The server-model registry of the edge env (``envs.servers.registry``): every model is there
with the one signature, params pick the model their clock and ``server_model`` name, and an
unknown name is refused naming the field."""
import pytest

from envs import edge
from envs.servers import registry
from envs.servers.base import Server
from prada_jax.errors import BadInput
from prada_jax.traces.testing import random_traces

TRACES = random_traces(seed=3, problems=4, depth=3, feature_dim=4)


@pytest.mark.parametrize("name", ["serving", "legacy", "paper"])
def test_registry_returns_each_server_model(name):
    srv = registry.get(name)
    assert isinstance(srv, Server) and srv.name == name
    assert all(callable(f) for f in srv[3:])


def test_server_models_are_registered():
    assert set(registry.SERVER_MODELS) <= set(registry.SERVERS)
    assert edge.SERVER_MODELS is registry.SERVER_MODELS


@pytest.mark.parametrize("hardware,model,want", [
    ("paper", "serving", "paper"), ("paper", "legacy", "paper"),
    ("a100_orin_int4", "serving", "serving"), ("a100_orin_int4", "legacy", "legacy")])
def test_params_choose_the_model(hardware, model, want):
    params = edge.make_params(TRACES, num_users=2, hardware=hardware, server_model=model,
                              num_servers=2)
    assert registry.server_of(params).name == want


def test_unknown_model_raises_bad_input_naming_the_field():
    with pytest.raises(BadInput, match="server_model"):
        registry.get("vllm")
    with pytest.raises(BadInput, match="server_model"):
        registry.check_server_model("paper")     # the clock's server, not a model to choose
    with pytest.raises(BadInput, match="server_model"):
        edge.make_params(TRACES, num_users=2, server_model="vllm")
