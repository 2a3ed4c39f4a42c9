"""Every model kind compiles whole: its training forward (the loss `minixl train` computes)
is one graph with no breaks, and once training is in its steady state (for xl, once the
memory is full) further steps compile nothing new."""

import dataclasses

import pytest
import torch
import torch._dynamo

from minixl.kinds import KINDS
from minixl.training import next_byte_objective

T = 32  # training length of these checks (the tiny presets, shortened)

pytestmark = pytest.mark.slow  # torch.compile takes seconds per model


def build(name: str):
    """(model, loss function (x, y, state) -> (losses, state)) of a tiny preset at length T."""
    kind = KINDS[name]
    cfg, _ = kind.preset("tiny")
    fields = {kind.length: T}
    if name == "xl":
        fields["mem_len"] = T  # full after one step
    torch.manual_seed(0)
    model = kind.build(dataclasses.replace(cfg, **fields))
    obj = kind.build_objective(cfg, kind.objective_options("tiny"))
    if obj is None:
        return model, lambda x, y, state: next_byte_objective(model, x, y, state)
    return model, lambda x, y, state: obj(model, x, y, state, 0.0)


def batch(seed: int):
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, 256, (2, T), generator=g)
    return x, torch.randint(0, 256, (2, T), generator=g)


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.mark.parametrize("name", list(KINDS))
def test_training_forward_is_one_graph_without_breaks(name):
    model, loss = build(name)
    x, y = batch(0)
    if name == "xl":  # as the trainer calls it: the first segment of a stream, no memory yet
        report = torch._dynamo.explain(lambda x, s: model.step(x, s))(x, None)
    else:
        report = torch._dynamo.explain(lambda x, y: loss(x, y, None)[0]["loss"])(x, y)
    reasons = [str(b.reason).splitlines()[0] for b in report.break_reasons]
    assert (report.graph_count, report.graph_break_count) == (1, 0), reasons


@pytest.mark.parametrize("name", list(KINDS))
def test_steady_state_training_steps_compile_nothing_new(name):
    model, loss = build(name)
    compiled = torch.compile(loss, backend="eager")
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    state = None

    def train_step(seed):
        nonlocal state
        parts, state = compiled(*batch(seed), state)
        opt.zero_grad(set_to_none=True)
        parts["loss"].backward()
        opt.step()
        return parts["loss"]

    for seed in range(3):  # warm up: xl's memory grows from 0 to mem_len = T here
        train_step(seed)
    graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    assert graphs >= 1, "nothing was compiled"
    with torch._dynamo.config.patch(error_on_recompile=True):
        losses = [train_step(seed) for seed in range(3, 6)]
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == graphs
    assert all(torch.isfinite(v) for v in losses)
    # and the compiled step computes what the eager one does: the same batch, state and
    # dropout masks (XLNet draws its orders from the global generator too)
    x, y = batch(9)
    values = []
    for fn in (compiled, loss):
        torch.manual_seed(9)
        with torch.no_grad():
            values.append({k: float(v) for k, v in fn(x, y, state)[0].items()})
    assert values[0].keys() == values[1].keys()
    for k in values[0]:
        assert abs(values[0][k] - values[1][k]) <= 1e-5 * (1 + abs(values[1][k])), (k, values)
