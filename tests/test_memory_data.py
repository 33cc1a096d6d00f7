"""Memory data: generated answers follow the fact timeline; gold pipeline through the bank; LoCoMo; F1."""

import json

import jax
import pytest

from toolverse_jax.envs import Catalog, EnvPool
from toolverse_jax.memory import data as D
from toolverse_jax.memory import roles as R
from toolverse_jax.memory.rollout import GoldActor, MemoryRolloutConfig, rollout_conversations
from toolverse_jax.models import load_tokenizer


# Session-text prefixes written out by hand (not read from the generator's templates).
_PREFIXES = (("I live in ", "city", "add"), ("I moved to ", "city", "add"),
             ("I work as a ", "job", "add"), ("My new job: ", "job", "add"),
             ("My dog is ", "dog", "add"), ("Correction: my dog is ", "dog", "fix"),
             ("I plan a trip to ", "trip", "add"), ("I cancelled the trip", "trip", "cancel"))


def _replay(conv: D.Conversation, as_of: int) -> dict:
    """Independent replay of the session texts: returns slot -> list of values (real changes)."""
    vals: dict = {}
    for s in conv.sessions[:as_of]:
        for pre, slot, how in _PREFIXES:
            if not s.text.startswith(pre):
                continue
            value = s.text[len(pre):].split(",")[0].rstrip(".")
            if how == "add":
                vals.setdefault(slot, []).append(value)
            elif how == "fix":
                vals[slot][-1] = value
            else:
                vals[slot].append(D.NONE)
    return vals


def _expected(vals: dict, q: D.Question) -> str:
    v = vals.get(q.slot, [])
    if q.kind == "latest":
        return v[-1] if v else D.NONE
    if q.kind == "history":
        return v[-2] if len(v) >= 2 else D.NONE
    return str(len(set(v)))


@pytest.mark.parametrize("num_sessions", [8, 16, 32])
def test_answers_follow_the_timeline(num_sessions):
    kinds = set()
    for conv in D.generate_conversations(12, num_sessions, seed=5, max_questions=8):
        assert conv.num_sessions == num_sessions
        for q in conv.questions:
            assert q.as_of == num_sessions
            assert q.answer == _expected(_replay(conv, q.as_of), q), (conv.id, q)
            kinds.add(q.kind)
        for k, probes in conv.probes.items():
            for q in probes:
                assert q.as_of == k and max(q.depends_on) <= k
                assert q.answer == _expected(_replay(conv, k), q), (conv.id, k, q)
                touched = [e.session for e in conv.timeline if e.slot == q.slot]
                assert set(q.depends_on) == {s for s in touched if s <= k}
    assert kinds == {"latest", "history", "aggregate"}
    assert D.generate_conversation(num_sessions, 3) == D.generate_conversation(num_sessions, 3)


def test_generator_has_moves_jobs_cancellations_corrections():
    kinds = {(e.slot, e.kind) for c in D.generate_conversations(20, 16, seed=1)
             for e in c.timeline}
    assert {("city", "change"), ("job", "change"), ("trip", "cancel"),
            ("dog", "correct")} <= kinds


def test_gold_roles_through_the_bank_answer_everything():
    tok = load_tokenizer("byte")
    convs = D.generate_conversations(6, 16, seed=9, max_questions=8)
    cfg = MemoryRolloutConfig()
    with EnvPool(Catalog.default(kinds=("builtin",), include_hidden=True), num_workers=0) as pool:
        trajs, _ = rollout_conversations(GoldActor(tok), convs, 1, pool, tok, cfg,
                                         jax.random.key(0))
    for tr, conv in zip(trajs, convs):
        assert not tr.infra_failed
        assert tr.em == [1.0] * len(conv.questions), list(zip(tr.answers, conv.questions))
        assert tr.op_counts["invalid"] == 0 and tr.op_counts["failed"] == 0
        # one extractor + one manager call per session, one answerer call per question
        assert [c.role for c in tr.calls].count("manager") == conv.num_sessions
        assert [c.role for c in tr.calls].count("answerer") == len(conv.questions)
    assert sum(t.op_counts["UPDATE"] for t in trajs) > 0
    assert sum(t.op_counts["DELETE"] for t in trajs) > 0


def test_parse_ops_and_gold_ops():
    ops, errors = R.parse_ops("ADD city: Oslo\nUPDATE m_0002 job: chef\nDELETE m_0003\nNOOP\nFLY")
    assert [o.line() for o in ops] == ["ADD city: Oslo", "UPDATE m_0002 job: chef",
                                       "DELETE m_0003", "NOOP"]
    assert len(errors) == 1 and "FLY" in errors[0]
    mem = [{"memory_id": "m_0001", "text": "city: Oslo", "history": []},
           {"memory_id": "m_0002", "text": "trip: Rome", "history": []}]
    got = R.gold_ops(["city: Lima", "trip: none", "job: chef", "city: Oslo"], mem)
    assert [o.line() for o in got] == ["UPDATE m_0001 city: Lima", "DELETE m_0002",
                                       "ADD job: chef"]
    assert R.gold_ops([], mem) == [R.Op("NOOP")]
    assert R.render_memory({"memory_id": "m_0001", "text": "city: Lima", "history": [
        {"text": "city: Oslo", "time": 1}, {"text": "city: Rome", "time": 2}]}) == \
        "m_0001 city: Lima; was: Rome, Oslo"


def test_qa_scores():
    assert D.token_f1("the Oslo city", "Oslo") == pytest.approx(2 * 0.5 * 1 / 1.5)
    assert D.token_f1("Rome", "Oslo") == 0.0 and D.exact_match("Oslo.", "oslo") == 1.0
    q = D.Question("q?", "Oslo", 1, (1,))
    assert D.qa_score(q, "Oslo", "em") == 1.0 and D.qa_score(q, None) == 0.0
    assert D.qa_score(q, "x", judge=lambda qq, gold, pred: 0.25) == 0.25
    with pytest.raises(ValueError, match="'f1' or 'em'"):
        D.qa_score(q, "x", "bleu")


def test_load_locomo(tmp_path):
    sample = {"sample_id": "conv-1", "conversation": {
        "speaker_a": "A", "speaker_b": "B", "session_1_date_time": "1 May",
        "session_1": [{"speaker": "A", "dia_id": "D1:1", "text": "I live in Oslo."}],
        "session_2": [{"speaker": "B", "dia_id": "D2:1", "text": "Moved?"},
                      {"speaker": "A", "dia_id": "D2:2", "text": "Yes, to Rome."}]},
        "qa": [{"question": "Where does A live?", "answer": "Rome", "evidence": ["D2:2"],
                "category": 1},
               {"question": "Adversarial?", "adversarial_answer": "x", "category": 5}]}
    path = tmp_path / "locomo.json"
    path.write_text(json.dumps([sample]))
    (conv,) = D.load_locomo(str(path))
    assert conv.id == "conv-1" and conv.num_sessions == 2
    assert conv.sessions[1].text == "B: Moved?\nA: Yes, to Rome."
    (q,) = conv.questions
    assert (q.answer, q.as_of, q.depends_on) == ("Rome", 2, (2,))
    with pytest.raises(FileNotFoundError, match="LoCoMo"):
        D.load_locomo(str(tmp_path / "missing.json"))
