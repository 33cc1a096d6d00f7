"""toolverse_jax.registry.Registry: register, duplicates, unknown names, and the tables using it."""

import pytest

from toolverse_jax.registry import Registry, UnknownNameError


def test_register_get_names_and_errors():
    reg = Registry("widget", hint="(add one with @reg.register({name!r}))")

    @reg.register("b")
    def b():
        return 2

    assert reg.register("a", len) is len
    assert reg.get("b") is b and reg["a"] is len
    assert reg.names() == ["a", "b"] == list(reg) and len(reg) == 2 and "a" in reg
    assert reg.register("b", b) is b  # the same object again is a no-op
    with pytest.raises(ValueError, match=r"widget 'b' is already registered \(in .*test_registry"):
        reg.register("b", lambda: 3)
    with pytest.raises(UnknownNameError) as e:
        reg.get("c")
    assert str(e.value) == ("unknown widget 'c' (not registered); registered widgets: ['a', 'b'] "
                            "(add one with @reg.register('c'))")
    # callers that caught KeyError (dict tables) or ValueError (explicit checks) still do
    assert isinstance(e.value, KeyError) and isinstance(e.value, ValueError)
    assert reg.names() == ["a", "b"]


def test_every_by_name_table_is_a_registry():
    from kernels.dispatch import IMPLS
    from toolverse_jax.eval.registry import EVALUATIONS
    from toolverse_jax.rl.losses import LOSSES
    from toolverse_jax.rl.registry import ADVANTAGES
    from toolverse_jax.rl.trace_scoring import SCORERS

    tables = {IMPLS: "chunked", EVALUATIONS: "gust", LOSSES: "ppo_clip", ADVANTAGES: "grpo",
              SCORERS: "single_pass"}
    for table, name in tables.items():
        assert isinstance(table, Registry) and name in table.names()
        with pytest.raises(UnknownNameError, match=f"registered {table.plural}: .*{name}"):
            table.get("nope")
