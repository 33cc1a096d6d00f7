"""The built-in search server (BM25 over a seeded world / a JSONL corpus) and search tasks."""

import json

import jsonschema
import pytest

from toolverse_jax.envs import Catalog, EnvPool, EpisodeSpec
from toolverse_jax.envs.builtin import search as srv
from toolverse_jax.tasks import Task
from toolverse_jax.tasks import search_tasks as st


@pytest.fixture(scope="module")
def pool():
    with EnvPool(Catalog.default(include_hidden=True), num_workers=0, call_timeout_s=5.0) as p:
        yield p


def _ok(obs):
    assert obs.status == "ok", (obs.status, obs.content)
    return obs.structured


def test_world_is_deterministic_and_seeded():
    assert srv.build_world(3) == srv.build_world(3)
    assert srv.build_world(3) != srv.build_world(4)
    w = srv.build_world(3)
    assert all(w["cities"][c["capital"]]["country"] == n for n, c in w["countries"].items())
    docs = srv.world_documents(w)
    assert len({d["docid"] for d in docs}) == len(docs) == sum(len(v) for v in w.values())


def test_planted_query_returns_the_right_docs():
    docs = [{"docid": "d1", "title": "Zebra facts", "text": "The zebra lives in Africa."},
            {"docid": "d2", "title": "Kettle", "text": "A kettle boils water. Tea needs it."},
            {"docid": "d3", "title": "Tea", "text": "Green tea and black tea come from leaves."}]
    c = srv.Corpus(docs)
    hits = c.search("black tea leaves", 5)
    assert [h["docid"] for h in hits][:2] == ["d3", "d2"] and len(hits) == 2  # d1 scores 0
    assert hits[0]["snippet"].startswith("Green tea") and hits[0]["score"] > hits[1]["score"]
    assert c.search("zebra", 1)[0]["docid"] == "d1"
    assert c.search("the of", 5) == []  # stop words only


def test_server_tools_through_pool(pool):
    (ep,) = pool.reset([EpisodeSpec(("search",), seed=11)])
    world = srv.build_world(11)
    person, facts = sorted(world["people"].items())[0]
    res = _ok(pool.step([(ep, "search", {"query": person, "k": 3})])[0])
    assert res["count"] >= 1 and res["results"][0]["title"] == person
    doc = _ok(pool.step([(ep, "get_document", {"docid": res["results"][0]["docid"]})])[0])
    assert facts["born_in"] in doc["text"] and facts["company"] in doc["text"]
    specs = {t["name"]: t for t in Catalog.default(include_hidden=True).list_tools("search")}
    assert set(specs) == {"search", "get_document"}
    jsonschema.validate(res, specs["search"]["outputSchema"])
    jsonschema.validate(doc, specs["get_document"]["outputSchema"])
    bad = pool.step([(ep, "get_document", {"docid": "nope"})])[0]
    assert bad.status == "tool_error" and "not found" in str(bad.content)
    assert pool.step([(ep, "search", {"query": "x", "k": 99})])[0].status == "tool_error"
    state = pool.read_state(ep)["search"]
    assert [c["tool"] for c in state["calls"]] == ["search", "get_document"]
    pool.close([ep])


def test_jsonl_corpus_and_browsecomp_plus_loader(tmp_path, monkeypatch):
    with open(tmp_path / "corpus.jsonl", "w") as f:
        for d in [{"docid": "a1", "title": "Mount Ulo", "text": "Mount Ulo is 4,100 m high."},
                  {"docid": "a2", "text": "The river Pell flows north into the Ulo lake."},
                  {"docid": "a3", "text": "Bread is baked from flour."},
                  {"docid": "a4", "title": "Owls", "text": "Owls hunt at night."}]:
            f.write(json.dumps(d) + "\n")
    with open(tmp_path / "queries.jsonl", "w") as f:
        f.write(json.dumps({"query_id": "7", "query": "How high is Mount Ulo?",
                            "answer": "4,100 m", "aliases": ["4100 m"],
                            "evidence_docs": [{"docid": "a1"}]}) + "\n")
    monkeypatch.setenv(srv.CORPUS_ENV, str(tmp_path))
    c = srv.corpus_for(0)
    assert c.search("how high mount ulo", 2)[0]["docid"] == "a1"
    (t,) = st.load_browsecomp_plus(str(tmp_path))
    assert isinstance(t, Task) and t.meta["gold_docids"] == ["a1"]
    assert st.check_answer(t, "4100 m") and st.check_answer(t, "4,100 m.")
    assert not st.check_answer(t, "4000 m")
    with pytest.raises(FileNotFoundError, match="corpus.jsonl"):
        srv.load_jsonl_corpus(str(tmp_path / "missing"))


def test_synthetic_tasks_hop_chains_are_findable():
    tasks = st.generate_search_tasks(40, seed=5)
    assert [t.to_json() for t in tasks] == [t.to_json() for t in st.generate_search_tasks(40, 5)]
    assert {t.meta["kind"] for t in tasks} == set(st.TEMPLATES)
    for t in tasks:
        assert t.servers == ("search",) and t.meta["hops"] == len(t.stages) in (2, 3)
        assert t.stats["depth"] == len(t.stages)
        corpus = srv.get_corpus(t.spec.seed)
        for stage, gold in zip(t.stages, t.meta["gold_docids"]):
            hits = corpus.search(stage[0].arguments["query"], 5)
            assert gold in [h["docid"] for h in hits]
        last = corpus.docs[corpus.by_id[t.meta["gold_docids"][-1]]]["text"]
        assert str(t.answer) in last  # the final hop's document states the answer
        assert t.check(str(t.answer)) and st.check_answer(t, str(t.answer).upper())
        assert not t.check("definitely not it")
        assert Task.from_json(json.loads(json.dumps(t.to_json()))).to_json() == t.to_json()
