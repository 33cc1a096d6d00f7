"""tasks/augment.py: fresh literals per SFT demonstration, replaced consistently."""

import json

import numpy as np
import pytest

from toolverse_jax.models import ByteTokenizer
from toolverse_jax.rl.rollout import RolloutConfig, gold_demonstration
from toolverse_jax.tasks import load_or_generate_quickstart_tasks
from toolverse_jax.tasks.augment import copied_literals, fresh_like, swap_literals


@pytest.fixture(scope="module")
def tasks():
    return load_or_generate_quickstart_tasks(None, num_tasks=64, horizons=(1, 2), seed=0)


def _text(task):
    return json.dumps([task.instruction, task.answer, task.verifier,
                       [[(s.arguments, s.observation) for s in st] for st in task.stages]])


def test_copied_literals_are_replaced_everywhere_and_nothing_else(tasks):
    with_lits = [t for t in tasks if copied_literals(t)]
    assert len(with_lits) >= 10
    for k, task in enumerate(with_lits):
        new = swap_literals(task, np.random.default_rng(k))
        old_text, new_text = _text(task), _text(new)
        for lit in copied_literals(task):
            assert lit not in new_text, (lit, new.instruction)
        # Same shape, same places: the new instruction states the new argument values.
        for st, nst in zip(task.stages, new.stages):
            for s, n in zip(st, nst):
                assert (s.server, s.tool, s.name, s.sources) == (n.server, n.tool, n.name,
                                                                 n.sources)
                assert set(s.arguments) == set(n.arguments)
                for key, v in s.arguments.items():
                    if v in copied_literals(task):
                        assert n.arguments[key] in new.instruction
                        assert len(n.arguments[key]) == len(v) or any(
                            c.isalpha() for c in v)
        assert (new.id, new.spec) == (task.id, task.spec)
        assert new_text != old_text and task.instruction != new.instruction
    task = with_lits[0]
    assert swap_literals(task, np.random.default_rng(5)).instruction == \
        swap_literals(task, np.random.default_rng(5)).instruction
    assert swap_literals(task, np.random.default_rng(5)).instruction != \
        swap_literals(task, np.random.default_rng(6)).instruction


def test_tasks_without_copied_literals_are_unchanged(tasks):
    plain = next(t for t in tasks if not copied_literals(t))
    assert _text(swap_literals(plain, np.random.default_rng(0))) == _text(plain)


def test_fresh_like_keeps_shape_id_prefixes_and_case():
    rng = np.random.default_rng(0)
    v = fresh_like("nt_0003", rng)
    assert v.startswith("nt_") and len(v) == 7 and v[3:].isdigit()
    t = fresh_like("Invoice report 10", rng)
    words = t.split()
    assert len(words) == 3 and words[0][0].isupper() and words[1].islower()
    assert words[2].isdigit() and len(words[2]) == 2
    assert fresh_like("2026-03-16", rng)[4] == "-" and len(fresh_like("17:00", rng)) == 5


def test_swapped_demonstration_renders_the_new_literals(tasks):
    task = next(t for t in tasks if copied_literals(t) and len(t.stages) == 1)
    new = swap_literals(task, np.random.default_rng(1))
    tok = ByteTokenizer()
    toks, mask, _ = gold_demonstration(new, [], tok, RolloutConfig(max_context=8192))
    policy = tok.decode([t for t, m in zip(toks, mask) if m])
    lit = next(v for v in new.stages[0][0].arguments.values()
               if isinstance(v, str) and v in new.instruction and len(v) >= 4)
    assert lit in policy and lit in tok.decode(toks)
    assert not any(old in tok.decode(toks) for old in copied_literals(task))
