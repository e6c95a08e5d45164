"""Hugging Face generation on the lazy device: a tiny Llama (GPT-2, Mistral, T5) built from its
config (no weights downloaded), greedy decoding of a left-padded batch, against the same model
in torch eager."""

import copy
import warnings

import hf_models
import pytest
import torch
import transformers

import ir_runtime as irt


def tiny_llama():
    return hf_models.causal("llama").eval()


def left_padded_batch():
    torch.manual_seed(1)
    ids = torch.randint(1, 96, (2, 5))
    mask = torch.ones_like(ids)
    ids[0, :2], mask[0, :2] = 0, 0  # the first row is 3 tokens, padded on the left
    return ids, mask


def generate(model, ids, mask, new_tokens, cache):
    kwargs = {"max_new_tokens": new_tokens, "do_sample": False, "pad_token_id": 0}
    if cache is not None:
        kwargs["cache_implementation"] = cache
    with torch.no_grad():
        return model.generate(ids, attention_mask=mask, **kwargs)


@pytest.mark.parametrize("cache", [None, "static"])
def test_greedy_generation_gives_eagers_tokens(cache):
    eager = tiny_llama()
    lazy = irt.to_lazy(copy.deepcopy(eager))
    ids, mask = left_padded_batch()
    want = generate(eager, ids, mask, 6, cache)
    got = generate(lazy, irt.to_lazy(ids), irt.to_lazy(mask), 6, cache)
    assert torch.equal(irt.to_torch(got), want)


@pytest.mark.parametrize("cache", [None, "dynamic"])
def test_each_token_runs_a_program_of_that_token_only(cache):
    """Each token's logits are read once its whole step has run (the new tokens, the key/value
    cache), so the next token's program starts from data: the largest program does not grow
    with the number of tokens generated, with the static cache or a growing one."""
    ids, mask = left_padded_batch()
    largest = []
    for new_tokens in (3, 6):
        lazy = irt.to_lazy(tiny_llama())
        irt.CACHE.clear()
        irt.reset_metrics()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", irt.GenerationWarning)
            generate(lazy, irt.to_lazy(ids), irt.to_lazy(mask), new_tokens, cache)
        m = irt.metrics()
        assert m["counters"]["ExecuteCount"] >= new_tokens
        largest.append(m["timers"]["GraphNodes"]["max"])
    assert largest[0] == largest[1], largest


def host_generate(model, ids, mask, new_tokens, **kwargs):
    kwargs = {"max_new_tokens": new_tokens, "pad_token_id": 0, **kwargs}
    with torch.no_grad():
        return irt.generate(model, ids, attention_mask=mask, **kwargs)


@pytest.mark.parametrize(
    "make",
    [
        lambda: hf_models.gpt2().eval(),
        lambda: hf_models.causal("mistral", sliding_window=4).eval(),
    ],
    ids=["gpt2", "mistral-sliding"],
)
def test_gpt2_and_mistral_generate_eagers_tokens_with_a_bounded_number_of_programs(make):
    """GPT-2 (its head tied to its embedding) and Mistral (a window of 4, shorter than the 5
    prompt tokens and the 8 generated), greedy from a left-padded batch with the static cache."""
    eager = make()
    lazy = irt.to_lazy(copy.deepcopy(eager))
    ids, mask = left_padded_batch()
    want = generate(eager, ids, mask, 8, "static")
    irt.CACHE.clear()
    irt.reset_metrics()
    got = host_generate(lazy, ids, mask, 8, cache_implementation="static")
    assert torch.equal(got, want)
    counters = irt.metrics()["counters"]
    # (the prefill and the decoding step; a sliding window's first decoding step may differ),
    # one program a token
    assert counters["CompileCount"] <= 3 and counters["ExecuteCount"] == 8, counters


@pytest.mark.parametrize("new_tokens", [4, 12])
def test_irt_generate_with_the_static_cache_compiles_two_programs(new_tokens):
    """The prefill and the decoding step: generation of any length compiles those two, then
    every token is a cache hit; tokens equal eager's (left padding included)."""
    eager = tiny_llama()
    lazy = irt.to_lazy(copy.deepcopy(eager))
    ids, mask = left_padded_batch()
    want = generate(eager, ids, mask, new_tokens, "static")
    irt.CACHE.clear()
    irt.reset_metrics()
    got = host_generate(lazy, ids, mask, new_tokens, cache_implementation="static")
    assert torch.equal(got, want)
    counters = irt.metrics()["counters"]
    assert counters["CompileCount"] == 2 and counters["ExecuteCount"] == new_tokens, counters
    # the decoding steps after the first three replayed, their Python not run (Llama's cache
    # is written in place only)
    assert counters.get("StepReplay", 0) == new_tokens - 4, counters
    # Again, as a server would: the same two programs, nothing compiled, every token a hit
    # (transformers' own reuse of the cache it kept would add a read and a prefill of its own);
    # the static cache is irt.generate's default, as model.generate's on a lazy model.
    irt.reset_metrics()
    again = host_generate(lazy, ids, mask, new_tokens)
    assert torch.equal(again, want)
    counters = irt.metrics()["counters"]
    assert counters.get("CompileCount", 0) == 0, counters
    assert counters["CacheHit"] + counters.get("StepReplay", 0) == new_tokens, counters


def test_irt_generate_samples_what_eager_samples_and_keeps_lazy_inputs_lazy():
    eager = tiny_llama()
    lazy = irt.to_lazy(copy.deepcopy(eager))
    ids, mask = left_padded_batch()
    kwargs = {"do_sample": True, "top_k": 20, "temperature": 0.8}
    torch.manual_seed(5)
    with torch.no_grad():
        want = eager.generate(ids, attention_mask=mask, max_new_tokens=6, pad_token_id=0, **kwargs)
    torch.manual_seed(5)  # sampling draws from torch's CPU generator, as eager's does
    got = host_generate(lazy, irt.to_lazy(ids), irt.to_lazy(mask), 6, **kwargs)
    assert isinstance(got, irt.LazyTensor)
    assert torch.equal(irt.to_torch(got), want)


@pytest.mark.parametrize("new_tokens", [4, 12])
def test_an_encoder_decoder_with_the_static_cache_compiles_a_bounded_number_of_programs(
    new_tokens,
):
    """T5 builds its decoder's mask as ones of the length so far, one more column a token;
    irt.generate gives it at the static cache's full length, so every decoding step is one
    program: eager's tokens (a padded encoder batch), and the compiles do not grow."""
    eager = hf_models.t5().eval()
    lazy = irt.to_lazy(copy.deepcopy(eager))
    ids, mask = left_padded_batch()
    kwargs = {"max_new_tokens": new_tokens, "do_sample": False, "attention_mask": mask}
    with torch.no_grad():
        want = eager.generate(ids, cache_implementation="static", **kwargs)
    irt.CACHE.clear()
    irt.reset_metrics()
    with torch.no_grad():
        got = irt.generate(lazy, ids, cache_implementation="static", **kwargs)
    assert torch.equal(got, want)
    counters = irt.metrics()["counters"]
    assert counters["CompileCount"] <= 3 and counters["CacheHit"] >= new_tokens - 2, counters


class Collect:
    """A streamer (transformers' ``BaseStreamer`` protocol): every ``put`` and the ``end``."""

    def __init__(self):
        self.puts, self.ended = [], 0

    def put(self, value):
        self.puts.append(value.clone())

    def end(self):
        self.ended += 1


class StopAtLength:
    """A user's stopping criterion: every row done once the sequence reaches ``n``."""

    def __init__(self, n):
        self.n = n

    def __call__(self, input_ids, scores, **kwargs):
        return torch.full((input_ids.shape[0],), input_ids.shape[-1] >= self.n)


@pytest.mark.parametrize("new_tokens", [8, 16])
def test_plain_generate_on_a_lazy_model_gives_eagers_tokens_with_a_bounded_number_of_programs(
    new_tokens,
):
    """``model.generate`` with default arguments, as a user calls it first: the lazy model takes
    irt.generate's path with the static cache, so 8 or 16 tokens compile the same programs."""
    eager = tiny_llama()
    lazy = irt.to_lazy(copy.deepcopy(eager))
    ids, mask = left_padded_batch()
    want = generate(eager, ids, mask, new_tokens, None)
    irt.CACHE.clear()
    irt.reset_metrics()
    got = generate(lazy, irt.to_lazy(ids), irt.to_lazy(mask), new_tokens, None)
    assert isinstance(got, irt.LazyTensor)
    assert torch.equal(irt.to_torch(got), want)
    counters = irt.metrics()["counters"]
    assert counters["CompileCount"] <= 3 and counters["ExecuteCount"] == new_tokens, counters
    assert counters["HostRead"] == 0, counters  # (the logits come back as the step's result)
    irt.reset_metrics()  # again, from host inputs: one read a token, its logits, and no compile
    assert torch.equal(generate(lazy, ids, mask, new_tokens, None), want)
    counters = irt.metrics()["counters"]
    assert counters["TransferToHost"] == new_tokens and counters["CompileCount"] == 0, counters


def test_plain_generate_samples_with_processors_stopping_criteria_and_a_streamer_as_eager():
    from transformers import StoppingCriteriaList

    eager = tiny_llama()
    lazy = irt.to_lazy(copy.deepcopy(eager))
    ids, mask = left_padded_batch()
    kwargs = {
        "do_sample": True,
        "temperature": 0.7,
        "top_k": 30,
        "top_p": 0.9,
        "repetition_penalty": 1.3,
        "max_new_tokens": 12,
        "pad_token_id": 0,
    }
    runs = []
    for model, (i, m) in ((eager, (ids, mask)), (lazy, (irt.to_lazy(ids), irt.to_lazy(mask)))):
        streamer = Collect()
        torch.manual_seed(3)
        with torch.no_grad():
            out = model.generate(
                i,
                attention_mask=m,
                streamer=streamer,
                stopping_criteria=StoppingCriteriaList([StopAtLength(ids.shape[1] + 7)]),
                **kwargs,
            )
        runs.append((irt.to_torch(out), streamer))
    (want, eager_stream), (got, lazy_stream) = runs
    assert want.shape[1] == ids.shape[1] + 7  # (stopped by the criterion, not max_new_tokens)
    assert torch.equal(got, want)
    assert lazy_stream.ended == eager_stream.ended == 1
    assert len(lazy_stream.puts) == len(eager_stream.puts)
    assert all(torch.equal(a, b) for a, b in zip(lazy_stream.puts, eager_stream.puts, strict=True))


def test_what_plain_generate_cannot_bound_is_refused_by_name_and_the_model_still_works():
    from transformers import DynamicCache

    eager = tiny_llama()
    lazy = irt.to_lazy(copy.deepcopy(eager))
    ids, mask = left_padded_batch()
    refused = {
        "beam search": {"num_beams": 2},
        "assisted generation": {"assistant_model": lazy},
        "`past_key_values`": {"past_key_values": DynamicCache()},
    }
    for name, kwargs in refused.items():
        with pytest.raises(irt.UnsupportedOpError, match=name):
            lazy.generate(ids, attention_mask=mask, max_new_tokens=3, pad_token_id=0, **kwargs)
    assert torch.equal(generate(lazy, ids, mask, 3, None), generate(eager, ids, mask, 3, None))


def test_a_growing_cache_the_call_asks_for_warns_once_and_gives_eagers_tokens():
    eager = tiny_llama()
    lazy = irt.to_lazy(copy.deepcopy(eager))
    ids, mask = left_padded_batch()
    with pytest.warns(irt.GenerationWarning, match="'dynamic'") as caught:
        got = generate(lazy, ids, mask, 4, "dynamic")
    assert len([w for w in caught if w.category is irt.GenerationWarning]) == 1
    assert caught[0].filename == __file__
    assert torch.equal(got, generate(eager, ids, mask, 4, "dynamic"))


def test_decoding_replays_give_every_output_field_and_leave_what_a_replay_cannot_redo():
    """The decoding steps replay without their Python (a cache written in place): the hidden
    states asked for come back from the replays as eager's. A hook inside the model, or a
    cache that counts in Python (a sliding window's), runs the forward every token instead."""
    eager = tiny_llama()
    lazy = irt.to_lazy(copy.deepcopy(eager))
    ids, mask = left_padded_batch()
    kwargs = {"output_hidden_states": True, "return_dict_in_generate": True}
    with torch.no_grad():
        want = eager.generate(ids, attention_mask=mask, max_new_tokens=7, pad_token_id=0, **kwargs)
    irt.reset_metrics()
    with torch.no_grad():
        got = lazy.generate(ids, attention_mask=mask, max_new_tokens=7, pad_token_id=0, **kwargs)
    if int(transformers.__version__.split(".")[0]) >= 5:
        # (transformers 4 records hidden states by setting each layer's forward in Python, an
        # effect a replay would not redo: every token runs the forward there)
        assert irt.metrics()["counters"]["StepReplay"] == 7 - 4
    assert torch.equal(got.sequences, want.sequences)
    assert len(got.hidden_states) == len(want.hidden_states) == 7
    for token_g, token_w in zip(got.hidden_states, want.hidden_states, strict=True):
        for g, w in zip(token_g, token_w, strict=True):
            torch.testing.assert_close(irt.to_torch(g), w, rtol=1e-5, atol=1e-5)

    calls = []
    hook = lazy.model.layers[0].register_forward_hook(lambda *a: calls.append(1))
    irt.reset_metrics()
    try:
        assert torch.equal(generate(lazy, ids, mask, 6, None), generate(eager, ids, mask, 6, None))
    finally:
        hook.remove()
    assert len(calls) == 6 and "StepReplay" not in irt.metrics()["counters"]

    mistral = hf_models.causal("mistral", sliding_window=4).eval()
    lazy_mistral = irt.to_lazy(copy.deepcopy(mistral))
    irt.reset_metrics()
    got = generate(lazy_mistral, ids, mask, 8, None)
    assert "StepReplay" not in irt.metrics()["counters"]
    assert torch.equal(got, generate(mistral, ids, mask, 8, "static"))


@pytest.mark.parametrize("masked", [True, False], ids=["mask", "pad-token-only"])
def test_absolute_positions_come_from_the_mask_as_eager_builds_them(masked):
    """GPT-2's learned positions from a left-padded batch: transformers builds the position ids
    (and, with no mask given, the mask from the pad token) from what the forward's signature
    takes; the lazy model's logits are eager's at every step, not only its tokens."""
    eager = hf_models.gpt2().eval()
    lazy = irt.to_lazy(copy.deepcopy(eager))
    ids, mask = left_padded_batch()
    kwargs = {"max_new_tokens": 6, "do_sample": False, "pad_token_id": 0}
    kwargs.update(output_logits=True, return_dict_in_generate=True)
    if masked:
        kwargs["attention_mask"] = mask
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (transformers' own advice about the missing mask)
        want = eager.generate(ids, cache_implementation="static", **kwargs)
        got = lazy.generate(ids, **kwargs)
    assert torch.equal(got.sequences, want.sequences)
    for g, w in zip(got.logits, want.logits, strict=True):
        torch.testing.assert_close(irt.to_torch(g), w, rtol=1e-5, atol=1e-5)
