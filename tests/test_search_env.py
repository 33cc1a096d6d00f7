"""The built-in search server (BM25 over a seeded world / a JSONL corpus) and search tasks."""

import concurrent.futures
import json
import logging
import os
import subprocess
import sys
import time

import jsonschema
import numpy as np
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


# ----------------------------------------------------------------------------- saved bm25s index
def _write_corpus(root, n=40):
    """corpus/a.jsonl + corpus/b.jsonl: doc i mentions 'topic{i % 7}' and its own 'tag{i}'."""
    (root / "corpus").mkdir()
    docs = [{"docid": f"d{i:03d}", "title": f"Doc {i}" if i % 3 else None,
             "text": f"Entry {i} is about topic{i % 7} and tag{i}. Filler words here."}
            for i in range(n)]
    for name, part in (("a", docs[: n // 2]), ("b", docs[n // 2:])):
        with open(root / "corpus" / f"{name}.jsonl", "w") as f:
            f.write("\n".join(json.dumps(d) for d in part) + "\n\n")
    return str(root)


@pytest.fixture
def corpus_dir(tmp_path, monkeypatch):
    monkeypatch.delenv(srv.INDEX_ENV, raising=False)
    return _write_corpus(tmp_path)


def _manifest(index_dir):
    with open(os.path.join(index_dir, "manifest.json")) as f:
        return json.load(f)


def test_saved_index_round_trip_is_mmapped_and_matches_in_memory(corpus_dir):
    d = srv.ensure_index(corpus_dir)
    assert os.path.dirname(d) == os.path.join(corpus_dir, srv.INDEX_DIRNAME)
    m = _manifest(d)
    assert m["num_docs"] == 40 and m["num_files"] == 2 and m["fingerprint"] == os.path.basename(d)
    c = srv.open_corpus(corpus_dir)
    assert c.index_dir == d and isinstance(c.docs, srv.LazyDocs)
    for key in ("data", "indices", "indptr"):
        assert isinstance(c.bm25.scores[key], np.memmap), key
    mem = srv.Corpus(srv.load_jsonl_corpus(corpus_dir))
    assert mem.index_dir is None
    for q in ("topic3", "tag17 topic2", "entry 5 filler", "doc 11", "nothing-like-this"):
        assert c.search(q, 10) == mem.search(q, 10), q
    assert [h["docid"] for h in c.search("tag17", 3)] == ["d017"]
    assert list(c.docs) == mem.docs and c.docs[-1] == mem.docs[-1] and c.by_id == mem.by_id
    assert srv.ensure_index(corpus_dir) == d and _manifest(d)["built_at"] == m["built_at"]
    out = srv.main(["--build-index", corpus_dir, "--verify"])
    assert out["index"] == d and out["num_docs"] == 40 and out["verified"] and not out["built_now"]


def test_saved_index_scores_and_ties_follow_bm25s(corpus_dir):
    c = srv.open_corpus(corpus_dir)
    q = srv.tokenize("topic3 tag3 topic3")
    ids = [c.bm25.vocab_dict[t] for t in q]
    want = c.bm25.get_scores(ids)  # bm25s's own scoring (duplicate query tokens count twice)
    hits = c.search("topic3 tag3 topic3", 20)
    assert [h["score"] for h in hits] == [round(float(want[c.by_id[h["docid"]]]), 4) for h in hits]
    # topic3 docs other than d003 tie pairwise on length: corpus order breaks the ties
    assert hits[0]["docid"] == "d003"
    assert {h["docid"] for h in hits} == {f"d{i:03d}" for i in range(40) if i % 7 == 3}


def test_changed_corpus_file_invalidates_the_index(corpus_dir, caplog):
    old = srv.ensure_index(corpus_dir)
    with open(os.path.join(corpus_dir, "corpus", "b.jsonl"), "a") as f:
        f.write(json.dumps({"docid": "new1", "text": "A zeppelin over topic3."}) + "\n")
    c = srv.open_corpus(corpus_dir)
    assert c.index_dir != old and not os.path.exists(old)  # rebuilt; the stale one pruned
    assert c.search("zeppelin", 1)[0]["docid"] == "new1" and len(c.docs) == 41
    # Rewritten in place with its size and mtime kept: the index cannot tell, the reader does.
    fp = os.path.join(corpus_dir, "corpus", "a.jsonl")
    st = os.stat(fp)
    text = open(fp).read().replace('"d004"', '"x004"')
    with open(fp, "w") as f:
        f.write(text)
    os.utime(fp, ns=(st.st_atime_ns, st.st_mtime_ns))
    stale = srv.open_corpus(corpus_dir)
    assert stale.index_dir == c.index_dir
    with pytest.raises(RuntimeError, match="changed since its search index was built"):
        stale.docs[4]


@pytest.mark.parametrize("damage", ["truncate_array", "flip_vocab", "no_manifest",
                                    "bad_manifest"])
def test_corrupt_index_is_detected_and_rebuilt(corpus_dir, caplog, damage):
    d = srv.ensure_index(corpus_dir)
    good = srv.open_corpus(corpus_dir).search("topic4 tag11", 5)
    if damage == "truncate_array":
        with open(os.path.join(d, "data.csc.index.npy"), "r+b") as f:
            f.truncate(os.path.getsize(f.name) - 8)
    elif damage == "flip_vocab":
        fp = os.path.join(d, "vocab.index.json")
        raw = bytearray(open(fp, "rb").read())
        i = raw.index(b"topic4")
        raw[i:i + 6] = b"topicX"  # same size, still valid JSON
        open(fp, "wb").write(bytes(raw))
    elif damage == "no_manifest":  # what a crash before the rename-into-place would leave
        os.remove(os.path.join(d, "manifest.json"))
    else:
        with open(os.path.join(d, "manifest.json"), "w") as f:
            f.write('{"format": 1, "fingerprint": "%s", "files": 7}' % os.path.basename(d))
    with pytest.raises(srv.StaleIndexError):
        srv.load_index(d, corpus_dir)
    with caplog.at_level(logging.WARNING):
        c = srv.open_corpus(corpus_dir)
    assert "ignoring a saved search index" in caplog.text
    assert c.index_dir == d and c.search("topic4 tag11", 5) == good
    srv.load_index(d, corpus_dir, full=True)  # whole again


def test_unwritable_process_builds_in_memory_and_writes_nothing(corpus_dir, monkeypatch, caplog):
    monkeypatch.setattr(srv, "_writable_files", lambda: False)  # as under isolate.py's limits
    with caplog.at_level(logging.WARNING):
        c = srv.open_corpus(corpus_dir)
    assert c.index_dir is None and "--build-index" in caplog.text
    assert not os.path.exists(os.path.join(corpus_dir, srv.INDEX_DIRNAME))
    assert c.search("tag17", 1)[0]["docid"] == "d017"
    d = srv.ensure_index(corpus_dir)  # what the CLI / the BrowseComp-Plus loader run once
    assert srv.open_corpus(corpus_dir).index_dir == d  # then found and mmapped, still no writes


def test_index_env_dir_and_concurrent_builders_build_once(corpus_dir, tmp_path, monkeypatch):
    monkeypatch.setenv(srv.INDEX_ENV, str(tmp_path / "idx"))
    calls = []
    real = srv._write_index

    def counting(*a, **kw):
        calls.append(1)
        time.sleep(0.2)  # let the other threads reach the lock
        return real(*a, **kw)

    monkeypatch.setattr(srv, "_write_index", counting)
    with concurrent.futures.ThreadPoolExecutor(3) as ex:
        dirs = list(ex.map(lambda _: srv.ensure_index(corpus_dir), range(3)))
    assert len(set(dirs)) == 1 and len(calls) == 1
    assert os.path.dirname(dirs[0]) == str(tmp_path / "idx")
    assert not [n for n in os.listdir(tmp_path / "idx") if n.startswith(".tmp-")]


def test_browsecomp_plus_loader_builds_the_saved_index_servers_use(corpus_dir, monkeypatch):
    with open(os.path.join(corpus_dir, "queries.jsonl"), "w") as f:
        f.write(json.dumps({"query_id": "1", "query": "Which doc has tag17?", "answer": "d017",
                            "gold_docs": ["d017"]}) + "\n")
    (t,) = st.load_browsecomp_plus(corpus_dir)
    assert t.meta["gold_docids"] == ["d017"]
    (d,) = [n for n in os.listdir(os.path.join(corpus_dir, srv.INDEX_DIRNAME))
            if not n.endswith(".lock")]
    monkeypatch.setenv(srv.CORPUS_ENV, corpus_dir)
    srv._dir_corpus.cache_clear()
    c = srv.corpus_for(0)
    assert c is srv.corpus_for(12345)  # one corpus for every seed
    assert os.path.basename(c.index_dir) == d
    # in-process servers, and an isolated server process of a worker (which must receive the
    # TOOLVERSE_SEARCH_CORPUS setting through the pool)
    for workers in (0, 1):
        with EnvPool(Catalog.default(include_hidden=True), num_workers=workers, call_timeout_s=30.0) as p:
            (ep,) = p.reset([EpisodeSpec(("search",), seed=3)])
            res = _ok(p.step([(ep, "search", {"query": "tag17 topic3", "k": 2})])[0])
            assert [h["docid"] for h in res["results"]] == [h["docid"] for h in
                                                            c.search("tag17 topic3", 2)], workers
            doc = _ok(p.step([(ep, "get_document", {"docid": "d017"})])[0])
            assert "tag17" in doc["text"]
            p.close([ep])
    srv._dir_corpus.cache_clear()


def test_bm25s_import_leaves_jax_alone():
    code = ("import sys; from toolverse_jax.envs.builtin import search as s; "
            "c = s.Corpus(s.world_documents(s.build_world(1))); "
            "assert c.search('capital', 3); print(sorted(m for m in ('jax', 'scipy', 'rank_bm25') "
            "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[]"


def test_ranking_agrees_with_rank_bm25_on_the_synthetic_worlds():
    rank_bm25 = pytest.importorskip("rank_bm25")

    def okapi_top(docs, query, k):  # the rank_bm25 Corpus.search this server had before
        toks = [srv.tokenize(d["title"] + " " + d["text"]) or ["_"] for d in docs]
        q = srv.tokenize(query)
        scores = rank_bm25.BM25Okapi(toks).get_scores(q)
        hits = [i for i, t in enumerate(toks) if set(q) & set(t)]
        return [docs[i]["docid"] for i in sorted(hits, key=lambda i: (-scores[i], i))[:k]]

    n = top1 = old_recall = new_recall = 0
    for t in st.generate_search_tasks(60, seed=7, with_observations=False):
        corpus = srv.get_corpus(t.spec.seed)
        for stage, gold in zip(t.stages, t.meta["gold_docids"]):
            q = stage[0].arguments["query"]
            old, new = okapi_top(corpus.docs, q, 5), [h["docid"] for h in corpus.search(q, 5)]
            n, top1 = n + 1, top1 + (old[0] == new[0])
            old_recall, new_recall = old_recall + (gold in old), new_recall + (gold in new)
    assert n > 100 and top1 == n and new_recall >= old_recall and new_recall == n


def test_build_bm25_makes_bm25s_index_arrays_bit_for_bit():
    import itertools
    import random

    bm25s = srv._bm25s()
    rng = random.Random(0)
    worlds = [srv._doc_tokens(d) for d in srv.world_documents(srv.build_world(3))]
    zipf = [[f"w{int(rng.paretovariate(1.1)) % 500}" for _ in range(rng.randint(1, 60))]
            for _ in range(400)] + [["_"]]
    for toks in (worlds, zipf):
        vocab = {t: i for i, t in enumerate(dict.fromkeys(itertools.chain.from_iterable(toks)))}
        ref = bm25s.BM25(k1=1.5, b=0.75, method="lucene")
        ref.index(([[vocab[t] for t in d] for d in toks], vocab), create_empty_token=False,
                  show_progress=False)
        got = srv.build_bm25(iter(toks))  # a generator: consumed once
        assert got.vocab_dict == ref.vocab_dict and got.scores["num_docs"] == len(toks)
        for key in ("data", "indices", "indptr"):
            assert got.scores[key].dtype == ref.scores[key].dtype, key
            assert np.array_equal(got.scores[key], ref.scores[key]), key
        q = [vocab[t] for t in toks[0][:3]]
        assert np.array_equal(got.get_scores(q), ref.get_scores(q))
    with pytest.raises(ValueError, match="empty"):
        srv.build_bm25([])
