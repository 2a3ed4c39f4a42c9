"""The matched-compute planner of the bench of every mechanism (minixl.planner): every
contestant sized to one parameter count and one budget of training FLOPs, its counts checked
by hand and against torch's own count of a training step."""

from dataclasses import replace

import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from minixl.kinds import KINDS
from minixl.model_kind import BenchArm
from minixl.planner import (FLOPS_TOLERANCE, PARAMS_TOLERANCE, arm_config, at_length, bench_arms, plan_arm,
                            plan_bench, sized_config)

pytestmark = pytest.mark.usefixtures("one_thread")  # see tests/conftest.py

BOOK_ARMS = {"char", "char+aux", "shaw", "xl", "xl-nomem", "xlnet", "segtree", "bpt"}
SETTING = dict(budget=1e12, params=200_000, length=128, batch_size=8)


@pytest.fixture(scope="module")
def plan():  # (1.5 s: the tests that read it are in the slow tier, the quick loop near 30 s)
    # the kernel count: what the implementation computes, which torch's counter can check
    return {r.arm: r for r in plan_bench(**SETTING, flop_policy="kernel")}


@pytest.mark.slow
def test_every_book_arm_is_matched_within_the_tolerances(plan):
    assert set(plan) == BOOK_ARMS
    for r in plan.values():
        assert r.matched, r
        assert abs(r.params / SETTING["params"] - 1) <= PARAMS_TOLERANCE
        assert abs(r.train_flops / SETTING["budget"] - 1) <= FLOPS_TOLERANCE
        assert r.train_flops == r.steps * r.flops_per_byte * r.batch_size * r.length
        assert getattr(r.config, KINDS[r.kind].length) == SETTING["length"]
    # the arms' own settings arrive: a memory as long as the segment, BPT's rule, the losses
    assert plan["xl"].config.mem_len == 128 and plan["xl"].config.tgt_len == 128
    assert (plan["bpt"].config.rule, plan["bpt"].config.k) == ("bpt", 4)
    assert plan["segtree"].config.rule == "segtree"
    assert plan["char+aux"].objective["aux_losses"] == "positions,layers,targets"
    assert plan["char"].objective["aux_losses"] == "positions"
    assert plan["xlnet"].config.n_predict == 21  # the tiny preset's 21 of 128, kept
    # more FLOPs per byte, fewer steps: the budget, not the step count, is what is equal
    assert plan["segtree"].flops_per_byte > plan["char"].flops_per_byte
    assert plan["segtree"].steps < plan["char"].steps


def test_the_counts_for_two_kinds_by_hand():
    """Chapter 1's model, and the same with Chapter 2's losses, counted from their configs:
    a tied embedding and head V C, a position table per layer L T C, per layer the attention
    (4 C^2 + 4 C), two norms (4 C) and the feed-forward (2 C F + F + C), the final norm 2 C.
    FLOPs: 6 per weight but the position table, and for the attention 12 L T C under the
    kernel count (every key of the window), 6 L (T + 1) C under the causal one (the bench's
    default: (T + 1) / 2 keys a query on average). The losses add one classifier (a norm and
    C x V with bias) and, on average over the run, (L - 1) / 4 intermediate readouts through
    the tied head, and the classifier on those layers too."""
    arms = {a: v for a, v in bench_arms().items() if a in ("char", "char+aux")}
    plans = {"causal": {r.arm: r for r in plan_bench(**SETTING, arms=arms)},  # the default
             "kernel": {r.arm: r for r in plan_bench(**SETTING, arms=arms,
                                                     flop_policy="kernel")}}
    for policy, plan in plans.items():
        for arm in ("char", "char+aux"):
            c = plan[arm].config
            V, C, L, T, F = c.vocab_size, c.d_model, c.n_layer, c.block_size, c.d_inner
            model = (V * C + L * T * C + L * (4 * C * C + 4 * C + 4 * C + 2 * C * F + F + C)
                     + 2 * C)
            scores = 12 * L * T * C if policy == "kernel" else 6 * L * (T + 1) * C
            flops = 6 * (model - L * T * C) + scores
            if arm == "char+aux":
                head = 2 * C + C * V + V
                model += head
                flops += 6 * (V * C * (L - 1) / 4 + head * (1 + (L - 1) / 4))
            assert (plan[arm].params, plan[arm].flop_policy) == (model, policy)
            assert plan[arm].flops_per_byte == pytest.approx(flops, rel=1e-12), (policy, arm)


def _tiny(kind_name: str, **fields):
    kind = KINDS[kind_name]
    torch.manual_seed(0)
    return kind, kind.build(kind.config(**{**kind.presets["tiny"].model, **fields}))


@pytest.mark.parametrize("kind_name,fields", [("char", {}), ("shaw", {}), ("xl", {}),
                                              ("segtree", {}), ("segtree", {"rule": "bpt"}),
                                              ("xlnet", {})])
def test_the_causal_policy_charges_each_query_the_keys_its_mask_lets_it_read(kind_name,
                                                                               fields):
    """Under 'causal', a dense layer's scores and weighted sums (12 C a key, per layer; XL's
    three products, 18 H D) are charged for the (query, key) pairs that minixl's own causal
    mask keeps, and Shaw's relative terms for the distinct clipped distances those pairs
    meet; XLNet's content score, position score and weighted sum (3 C a key) for the pairs
    its factorisation masks keep, in both streams, counted from the masks of random orders
    (its last content stream forward only); the weights cost the same under both policies.
    The tree's count is of its causal edges already: one count."""
    from minixl.char_transformer import causal_mask

    kind, model = _tiny(kind_name, **fields)
    c = model.config
    kernel, causal = kind.flops_per_token(model), kind.flops_per_token(model, "causal")
    assert kernel == kind.flops_per_token(model, "kernel")
    if kind_name in ("char", "shaw"):
        T, L, C = c.block_size, c.n_layer, c.d_model
        kept = causal_mask(T)
        saved = 12 * L * C * (T - kept.sum().item() / T)
        if kind_name == "shaw":
            K = c.max_relative
            i, j = kept.nonzero().unbind(1)
            met = len(set((j - i).clamp(-K, K).tolist()))
            saved += 12 * L * C * (2 * K + 1 - met)
            assert met == K + 1
        assert kernel - causal == pytest.approx(saved, rel=1e-12)
    elif kind_name == "xl":
        T, M = c.tgt_len, c.mem_len
        kept = causal_mask(T, T + M).sum().item() / T  # keys a query reads, on average
        assert kernel - causal == pytest.approx(
            18 * c.n_layer * c.n_head * c.d_head * (T + M - kept), rel=1e-12)
    elif kind_name == "xlnet":
        from minixl.xlnet import permutation_masks

        T, P, C, L = c.seq_len, c.n_predict, c.d_model, c.n_layer
        for seed in range(3):  # any order keeps the same number of pairs
            order = torch.randperm(T, generator=torch.Generator().manual_seed(seed))
            content, query = permutation_masks(order, n_predict=P)
            rows = {"content": content.sum().item() / T,  # keys per content row
                    "both": (content.sum().item() + query[order[T - P:]].sum().item()) / T}
            full = C * (4 * T - 1)  # the kernel count's content, position and sum, a row
            saved = (6 * L * (full * (T + P) / T - 3 * C * rows["both"])
                     - 4 * (full - 3 * C * rows["content"]))
            assert kernel - causal == pytest.approx(saved, rel=1e-12)
    else:
        assert causal == kernel
    if kind_name != "segtree":
        assert causal < kernel


def test_the_causal_policy_keeps_the_objectives_flops_and_refuses_an_unknown_policy():
    kind, model = _tiny("char")
    objective = kind.build_objective(model.config, {"aux_losses": "positions,layers,targets",
                                                    "aux_targets": 1})
    extra = kind.training_flops_per_token(model, objective) - kind.flops_per_token(model)
    assert extra > 0
    assert kind.training_flops_per_token(model, objective, "causal") == pytest.approx(
        kind.flops_per_token(model, "causal") + extra, rel=1e-12)
    with pytest.raises(ValueError, match="unknown FLOP policy 'half': expected one of "
                                         "kernel, causal"):
        kind.flops_per_token(model, "half")


def test_the_command_lines_flop_policy_default_is_the_planners():
    """The registry spells its options out (it loads without torch); its --flop-policy default
    and choices must be the planner's BENCH_FLOP_POLICY and minixl.model_kind.FLOP_POLICIES."""
    from minixl.experiments import EXPERIMENTS
    from minixl.model_kind import FLOP_POLICIES
    from minixl.planner import BENCH_FLOP_POLICY

    benches = [e for e in EXPERIMENTS.values()
               if any(o.name == "flop_policy" for o in e.options)]
    assert len(benches) >= 3  # bench_all, bench_context, bench_recall
    for e in benches:
        (option,) = [o for o in e.options if o.name == "flop_policy"]
        assert option.default == BENCH_FLOP_POLICY
        assert set(option.choices) == set(FLOP_POLICIES)


def test_one_policy_counts_every_arm_and_the_causal_one_buys_the_dense_arms_more_steps():
    arms = {a: v for a, v in bench_arms().items() if a in ("char", "shaw", "xl", "xlnet",
                                                            "segtree")}
    kernel = {r.arm: r for r in plan_bench(**SETTING, arms=arms, flop_policy="kernel")}
    causal = {r.arm: r for r in plan_bench(**SETTING, arms=arms)}  # the bench's default
    for arm, r in causal.items():
        kind = KINDS[r.kind]
        with torch.device("meta"):
            model = kind.build(r.config)
            objective = kind.build_objective(r.config, r.objective)
        assert r.config == kernel[arm].config  # the sizes do not depend on how FLOPs count
        assert r.flops_per_byte == kind.training_flops_per_token(model, objective, "causal")
        assert kernel[arm].flops_per_byte == kind.training_flops_per_token(model, objective)
        assert r.matched and (r.flop_policy, kernel[arm].flop_policy) == ("causal", "kernel")
        assert r.as_row()["flop_policy"] == "causal" and "flop_policy" not in kernel[arm].as_row()
        assert kind.flops_note("causal") in r.why and kind.flops_note() in kernel[arm].why
    assert "causal policy" in causal["shaw"].why and "causal" not in kernel["shaw"].why
    for arm in ("char", "shaw", "xl", "xlnet"):  # masked pairs no longer charged: more steps
        assert causal[arm].flops_per_byte < kernel[arm].flops_per_byte
        assert causal[arm].steps > kernel[arm].steps
    assert causal["segtree"].steps == kernel["segtree"].steps  # its count was causal already
    # a planned row carries its policy to other lengths
    kind, arm = arms["shaw"]
    assert at_length(kind, arm, causal["shaw"], 256)[2] < at_length(kind, arm, kernel["shaw"],
                                                                    256)[2]
    with pytest.raises(ValueError, match="unknown FLOP policy 'half': expected one of "
                                         "kernel, causal"):
        plan_bench(**SETTING, arms=arms, flop_policy="half")


@pytest.mark.slow
@pytest.mark.parametrize("arm", sorted(BOOK_ARMS))
def test_the_flops_per_byte_are_what_torch_counts(plan, arm):
    """Each arm's count against torch's count of one training step's matrix products (the
    fused attention kernel replaced by its plain form, which torch can count; XL with its
    memory full; the auxiliary losses averaged over the run's progress): within 4 %."""
    r = plan[arm]
    kind = KINDS[r.kind]
    torch.manual_seed(0)
    model = kind.build(r.config)
    objective = kind.build_objective(r.config, r.objective)
    batches = kind.batches(torch.randint(0, 256, (8192,)), 2, r.config, seed=0)
    state = None
    if kind.reads_streams(r.config):
        with torch.no_grad():
            _, state = model.step(batches(0)[0])
    x, y, _ = batches(1)
    progress = [(i + 0.5) / 32 for i in range(32)] if arm == "char+aux" else [0.5]
    total = 0
    for p in progress:
        with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
            if objective is None:
                logits, _ = model.step(x, state)
                loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), y.flatten())
            elif arm == "char+aux":
                loss = objective(model, x, y, progress=p)[0]["loss"]
            else:
                loss = objective(model, x, y, state)[0]["loss"]
            loss.backward()
        total += counter.get_total_flops()
    counted = total / len(progress) / x.numel()
    assert abs(r.flops_per_byte / counted - 1) < 0.04, (r.flops_per_byte, counted)


def test_a_budget_too_small_for_one_match_says_so():
    r = plan_arm("segtree", KINDS["segtree"], KINDS["segtree"].bench_arms["segtree"],
                 budget=1e9, params=200_000, length=128, batch_size=8)
    assert r.steps == 1 and not r.matched and r.flops_off > FLOPS_TOLERANCE
    assert "of the budget: raise --budget" in r.why
    with pytest.raises(ValueError, match="budget must be positive, got 0"):
        plan_bench(**dict(SETTING, budget=0))


def test_a_kind_of_your_own_enters_with_its_defaults_and_names_must_differ():
    mine = replace(KINDS["segtree"], name="mine", bench={})
    arms = bench_arms([mine, "char"])
    assert list(arms) == ["mine", "char", "char+aux"]
    assert arms["mine"][1] == BenchArm(help=mine.summary)
    [r] = plan_bench(**SETTING, arms={"mine": arms["mine"]})
    assert r.matched and r.kind == "mine" and r.config.rule == "segtree"
    twin = replace(KINDS["segtree"], name="twin")  # declares 'segtree' and 'bpt' again
    with pytest.raises(ValueError, match="two bench arms are called 'segtree'"):
        bench_arms(["segtree", twin])


def test_a_bench_arm_that_names_a_missing_field_is_refused_when_declared():
    with pytest.raises(ValueError, match="bench arm 'wide': width is not a field"):
        replace(KINDS["char"], bench={"wide": BenchArm(model={"width": 3})})
    with pytest.raises(ValueError, match="bench arm 'x': aux_weight is not a field, objective"):
        replace(KINDS["char"], bench={"x": BenchArm(objective={"aux_weight": 1})})


def test_the_depth_moves_when_no_width_comes_near():
    """A kind whose heads make its narrowest model too big for the target: the planner tries
    the other depths and says so."""
    wide_heads = replace(KINDS["char"], name="wide-heads", bench={}, presets={
        "tiny": replace(KINDS["char"].presets["tiny"],
                        model=dict(KINDS["char"].presets["tiny"].model, n_head=64, n_layer=8))})
    [r] = plan_bench(**dict(SETTING, params=150_000),
                     arms=bench_arms([wide_heads]))
    assert r.config.n_layer < 8 and "came within 10 %: " in r.why


def test_a_kind_that_builds_at_no_width_is_refused_not_planned_forever():
    def refuse(config):
        raise ValueError("too narrow")

    never = replace(KINDS["char"], name="never", bench={}, build=refuse)
    with pytest.raises(ValueError, match="bench arm 'never': no width of --model never builds "
                                         "at length 128 \\(the last refusal: too narrow\\)"):
        plan_bench(**SETTING, arms=bench_arms([never]))


def test_xl_without_memory_differs_from_xl_in_its_memory_alone():
    arms = bench_arms()
    plans = {r.arm: r for r in plan_bench(budget=2e11, params=200_000, length=128,
                                          batch_size=8, arms={a: arms[a] for a in
                                                              ("xl", "xl-nomem")})}
    xl, bare = plans["xl"].config, plans["xl-nomem"].config
    assert xl.mem_len == 128 and bare.mem_len == 0
    assert replace(bare, mem_len=xl.mem_len) == xl  # every other field the same
    kind = arms["xl"][0]
    assert kind.reach(bare)[0] == 128 < kind.reach(xl)[0]
    assert plans["xl-nomem"].steps > plans["xl"].steps  # no memory to attend: cheaper steps


def test_a_per_length_field_keeps_the_arms_own_ratio_where_the_arm_sets_it():
    from minixl.model_kind import BenchArm

    kind = bench_arms()["xl"][0]  # the tiny preset: segments and memory of 128
    half = BenchArm(model=dict(mem_len=64), per_length=("mem_len",))
    assert arm_config(kind, half, 32).mem_len == 16
    assert arm_config(kind, BenchArm(per_length=("mem_len",)), 32).mem_len == 32


def test_the_bench_ties_every_arms_head_and_a_tied_head_costs_no_fewer_flops():
    from minixl.segtree import SegTreeConfig, SegTreeTransformer

    for arm in ("segtree", "bpt"):
        kind, spec = bench_arms()[arm]
        assert spec.model["tie_head"] is True
    cfg = SegTreeConfig(n_layer=2, d_model=32, n_head=4, d_inner=64, block_size=16)
    untied, tied = SegTreeTransformer(cfg), SegTreeTransformer(replace(cfg, tie_head=True))
    assert tied.head.weight is tied.tok.weight
    count = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731
    assert count(untied) - count(tied) == 256 * 32
    kind = bench_arms()["segtree"][0]
    assert kind.flops_per_token(tied) == kind.flops_per_token(untied)  # the head still multiplies
    x = torch.zeros(1, 4, dtype=torch.long)  # no byte 7 in the input
    for model, moves in ((tied, True), (untied, False)):
        before = model(x).detach()
        with torch.no_grad():
            model.tok.weight[7] += torch.randn(32)  # tied: byte 7's output row moves with its embedding
        after = model(x).detach()
        assert torch.equal(before[..., :7], after[..., :7])
        assert (not torch.allclose(before[..., 7], after[..., 7])) == moves


def test_a_tied_tree_table_starts_where_its_first_logits_have_unit_variance():
    """Tied, the one table starts at N(0, 1 / C), so the untrained model's logits (ln_f's
    output, entries of about 1, times the table) have variance about 1 and its first loss is
    near a uniform guess's; kept at the embedding's N(0, 1), the logits would spread about
    sqrt(C) and the first loss be several times worse. Untied, the embedding keeps N(0, 1)."""
    import math

    from minixl.segtree import SegTreeConfig, SegTreeTransformer

    cfg = SegTreeConfig(n_layer=2, d_model=64, n_head=4, d_inner=128, block_size=64)
    torch.manual_seed(0)
    untied, tied = SegTreeTransformer(cfg), SegTreeTransformer(replace(cfg, tie_head=True))
    assert abs(untied.tok.weight.std().item() - 1) < 0.03
    assert abs(tied.tok.weight.std().item() * math.sqrt(64) - 1) < 0.03
    x = torch.randint(0, 256, (4, 64))
    with torch.no_grad():
        logits = tied(x)
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), x.roll(-1, 1).flatten())
        assert 0.7 < logits.std().item() < 1.4
        assert loss.item() < math.log(256) + 1  # a uniform guess: log 256 = 5.5 nats
        tied.tok.weight.normal_()  # the embedding's own start, for contrast
        far = torch.nn.functional.cross_entropy(tied(x).flatten(0, 1), x.roll(-1, 1).flatten())
    assert far.item() > 2 * math.log(256)


@pytest.mark.parametrize("arm", sorted(BOOK_ARMS))
def test_each_arms_kernel_line_says_what_a_one_byte_call_reuses(arm):
    """The cost sweep's `kernel` column: a window model's line says a one-byte call reads its
    window again, and its state after a call is that window's bytes; XL's says the memory's
    keys and values are cached, and in inference its state is that cache (section 4.11)."""
    from minixl.transformer_xl import KVCache

    kind, spec = bench_arms()[arm]
    config = sized_config(arm_config(kind, spec, 16), 32, 2)
    note = kind.kernel_note(config)
    torch.manual_seed(0)
    model = kind.build(config).eval()
    with torch.no_grad():
        _, state = model.step(torch.randint(0, 256, (1, 8)))
    if "cached keys and values" in note:
        assert isinstance(state, KVCache), (arm, note, type(state))
    else:
        assert "reads its window again" in note or "reads the last" in note, note
        assert torch.is_tensor(state) and not state.is_floating_point(), (arm, type(state))
    assert note != "not stated by its kind"
    assert ("fused" in note) == (arm in ("char", "char+aux")), note
