"""Multi-hop search QA tasks over the built-in `search` server, as GUST `Task` records.

- `generate_search_tasks(n, seed)`: synthetic questions over the seeded world of
  `envs/builtin/search.py` (each task its own world: `task.spec.seed`), 2 or 3 hops, with the
  gold hop chain (one `search` call per hop, the doc that holds each fact) and an exact-match
  verifier on the final entity.
- `load_browsecomp_plus(path)`: BrowseComp-Plus-format queries from a local directory
  (`queries.jsonl`: {"query_id", "query", "answer", "aliases"?, "gold_docs"?|"evidence_docs"?};
  documents in `corpus.jsonl`, served when `TOOLVERSE_SEARCH_CORPUS` points at the directory).

Answers may have aliases: `verifier["aliases"]` and `meta["aliases"]` (TRACE scores the best
alias); `check_answer(task, text)` accepts any of them (`Task.check` reads only the value).
"""

from __future__ import annotations

import json
import logging
import os
import random
from typing import Iterable

from toolverse_jax.tasks.task import GoldStep, Task, episode_spec, values_equal

SERVER = "search"

# (kind, hops, question template, chain builder) — the chain lists (entity, doc kind, fact).
TEMPLATES = ("birth_country", "company_city", "company_country", "capital_of_birth_country",
             "company_founded")


def _doc_ids(corpus_docs) -> dict:
    return {d["title"]: d["docid"] for d in corpus_docs}


def make_question(world: dict, docids: dict, kind: str, person: str) -> dict:
    """Returns {question, answer, hops: [(query, docid)]} for one template and person."""
    p = world["people"][person]
    city, comp = p["born_in"], p["company"]
    c = world["companies"][comp]
    if kind == "birth_country":
        country = world["cities"][city]["country"]
        return {"question": f"In which country was {person} born?", "answer": country,
                "hops": [(person, docids[person]), (city, docids[city])]}
    if kind == "company_city":
        return {"question": f"In which city is the headquarters of the company {person} "
                            f"works for?", "answer": c["city"],
                "hops": [(person, docids[person]), (comp, docids[comp])]}
    if kind == "company_founded":
        return {"question": f"In what year was the company that employs {person} founded?",
                "answer": str(c["founded"]),
                "hops": [(person, docids[person]), (comp, docids[comp])]}
    if kind == "company_country":
        country = world["cities"][c["city"]]["country"]
        return {"question": f"In which country is the headquarters of the company {person} "
                            f"works for?", "answer": country,
                "hops": [(person, docids[person]), (comp, docids[comp]),
                         (c["city"], docids[c["city"]])]}
    if kind == "capital_of_birth_country":
        country = world["cities"][city]["country"]
        return {"question": f"What is the capital of the country where {person} was born?",
                "answer": world["countries"][country]["capital"],
                "hops": [(person, docids[person]), (city, docids[city]),
                         (country, docids[country])]}
    raise ValueError(f"unknown search question kind {kind!r}; use one of {TEMPLATES}")


def _task(tid: str, instruction: str, answer: str, aliases: list, seed: int, stages, meta):
    return Task(id=tid, instruction=instruction, spec=episode_spec((SERVER,), seed),
                stages=stages, answer=answer,
                verifier={"kind": "exact", "value": answer, "aliases": aliases},
                meta=dict(meta, aliases=[answer] + [a for a in aliases if a != answer]))


def generate_search_tasks(n: int, seed: int = 0, kinds: Iterable[str] = TEMPLATES,
                          k: int = 5, with_observations: bool = True) -> list:
    """Returns `n` synthetic multi-hop search `Task`s, deterministic in (n, seed, kinds).

    Task i uses world seed `seed * 1_000_003 + i` (its `spec.seed`); gold stage h is one
    `search(query=<entity of hop h>, k)` whose results contain the hop's document.
    """
    from toolverse_jax.envs.builtin import search as srv

    kinds = tuple(kinds)
    rng = random.Random(f"search-tasks:{seed}")
    tasks = []
    for i in range(n):
        wseed = seed * 1_000_003 + i
        world = srv.build_world(wseed)
        corpus = srv.get_corpus(wseed)
        docids = _doc_ids(corpus.docs)
        kind = kinds[i % len(kinds)]
        person = rng.choice(sorted(world["people"]))
        q = make_question(world, docids, kind, person)
        stages = []
        for h, (query, docid) in enumerate(q["hops"]):
            obs = {"query": query, "results": corpus.search(query, k)} if with_observations \
                else None
            # hop h's entity is read off hop h-1's document: a value flow for chain_depth
            src = {"from": "literal"} if h == 0 else {"from": "step", "stage": h - 1,
                                                      "index": 0, "field": "results.0.snippet"}
            stages.append([GoldStep(SERVER, "search", "search", {"query": query, "k": k}, obs,
                                    {"query": src})])
        instruction = (f"{q['question']} Use the search tools to find out, then reply with "
                       f"just the answer.")
        tasks.append(_task(f"search-{seed}-{i:05d}", instruction, q["answer"], [], wseed, stages,
                           {"source": "synthetic", "kind": kind, "question": q["question"],
                            "hops": len(q["hops"]),
                            "gold_docids": [d for _, d in q["hops"]]}))
    return tasks


def load_browsecomp_plus(path: str, limit: int | None = None, build_index: bool = True) -> list:
    """Returns `Task`s from a BrowseComp-Plus-format directory (or a queries .jsonl file).

    No gold tool stages (the dataset has none); `meta["gold_docids"]` holds the evidence/gold
    docs when given. Serve the matching corpus with TOOLVERSE_SEARCH_CORPUS=<dir>. With
    `build_index`, a directory's corpus gets its saved BM25 index here (built once if missing or
    stale), so the search server processes memory-map it instead of each building one.
    """
    qpath = path if os.path.isfile(path) else os.path.join(path, "queries.jsonl")
    if not os.path.isfile(qpath):
        raise FileNotFoundError(f"no queries at {qpath!r}: expected queries.jsonl with lines "
                                f"{{'query_id', 'query', 'answer'}}")
    if build_index and os.path.isdir(path):
        from toolverse_jax.envs.builtin import search as srv
        try:
            srv.ensure_index(path)
        except FileNotFoundError:  # queries only: the corpus is served from elsewhere
            pass
        except OSError as e:  # read-only everywhere: the servers build in memory (and say so)
            logging.getLogger(__name__).warning("no saved search index: %s", e)
    tasks = []
    with open(qpath) as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            d = json.loads(line)
            missing = [k for k in ("query", "answer") if k not in d]
            if missing:
                raise ValueError(f"{qpath}:{n}: query line lacks {missing}; got keys {sorted(d)}")
            gold = d.get("gold_docs") or d.get("evidence_docs") or []
            gold = [str(g["docid"]) if isinstance(g, dict) else str(g) for g in gold]
            qid = str(d.get("query_id", n))
            aliases = [str(a) for a in d.get("aliases", [])]
            tasks.append(_task(f"bcp-{qid}", str(d["query"]), str(d["answer"]), aliases, 0, [],
                               {"source": "browsecomp_plus", "query_id": qid,
                                "gold_docids": gold}))
            if limit is not None and len(tasks) >= limit:
                break
    return tasks


def check_answer(task: Task, answer_text: str | None) -> bool:
    """Returns whether `answer_text` exactly matches (normalized) the answer or an alias."""
    if answer_text is None:
        return False
    return any(values_equal(a, answer_text) for a in task.meta.get("aliases") or [task.answer])
