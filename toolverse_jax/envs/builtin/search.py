"""Built-in search server: BM25 `search` and `get_document` over a local document corpus.

Two corpora:
- synthetic (default): a world generated deterministically from the episode seed — people born
  in cities, working at companies headquartered in cities, cities in countries with capitals —
  written as short documents that each state one or two facts, so a multi-hop question (see
  `toolverse_jax.tasks.search_tasks`) needs several searches. Each seed is a different world, so
  answers cannot be memorized across tasks.
- a BrowseComp-Plus-format directory, when `TOOLVERSE_SEARCH_CORPUS` names one: `corpus.jsonl`
  (or `corpus/*.jsonl`) with one JSON object per line {"docid", "text", "title"?, "url"?}. The
  corpus is then the same for every seed.

Corpora and their BM25 indexes are built once per process and cached (the episode state only
records the corpus key and the calls made), so many episodes share one index.
"""

from __future__ import annotations

import functools
import glob
import json
import os
import random
import re
from typing import Any

from typing_extensions import TypedDict

from toolverse_jax.envs.builtin.base import Domain, db, fail

CORPUS_ENV = "TOOLVERSE_SEARCH_CORPUS"
MAX_K = 20
SNIPPET_CHARS = 240

_STOP = frozenset("a an and are as at be by for from in is it of on or that the this to was "
                  "were which who whom what when where with".split())


def tokenize(text: str) -> list[str]:
    """Returns lower-cased word tokens without stop words (the BM25 analyzer)."""
    return [w for w in re.findall(r"[a-z0-9]+", text.lower()) if w not in _STOP]


# ----------------------------------------------------------------------------- synthetic world
_ONSETS = ("b br c d dr f g gr h j k l m n p qu r s st t tr v w z th sh").split()
_VOWELS = ("a e i o u ae io ia ou ei").split()
_CODAS = ("", "", "n", "r", "l", "s", "th", "m", "x", "nd", "rk")
ROLES = ("engineer", "chemist", "designer", "analyst", "architect", "teacher", "surgeon", "pilot")
INDUSTRIES = ("shipping", "software", "mining", "textiles", "aviation", "pharmaceuticals",
              "publishing", "robotics")
CONTINENTS = ("Arcadia", "Borealis", "Meridia", "Austrina")
WORLD_SIZES = {"countries": 6, "cities": 18, "companies": 12, "people": 30}


def _word(rng: random.Random, syllables: int) -> str:
    w = "".join(rng.choice(_ONSETS) + rng.choice(_VOWELS) for _ in range(syllables))
    return (w + rng.choice(_CODAS)).capitalize()


def _names(rng: random.Random, n: int, make, taken: set) -> list[str]:
    out = []
    while len(out) < n:
        name = make()
        if name not in taken:
            taken.add(name)
            out.append(name)
    return out


@functools.lru_cache(maxsize=256)
def build_world(seed: int, sizes: tuple = tuple(sorted(WORLD_SIZES.items()))) -> dict:
    """Returns the synthetic world of `seed`: {countries, cities, companies, people} facts."""
    s = dict(sizes)
    rng = random.Random(f"search-world:{seed}")
    taken: set = set()
    countries = _names(rng, s["countries"], lambda: _word(rng, 2) + rng.choice(("ia", "land", "")),
                       taken)
    cities = _names(rng, s["cities"], lambda: _word(rng, rng.choice((1, 2))), taken)
    companies = _names(rng, s["companies"], lambda: f"{_word(rng, 2)} "
                       f"{rng.choice(('Labs', 'Works', 'Group', 'Systems', 'Holdings'))}", taken)
    people = _names(rng, s["people"], lambda: f"{_word(rng, 1)} {_word(rng, 2)}", taken)
    city_country = {c: countries[i % len(countries)] for i, c in enumerate(cities)}
    rng.shuffle(cities)
    world = {
        "countries": {c: {"capital": next(x for x in cities if city_country[x] == c),
                          "continent": rng.choice(CONTINENTS)} for c in countries},
        "cities": {c: {"country": city_country[c], "population": rng.randint(20, 900) * 1000}
                   for c in cities},
        "companies": {c: {"city": rng.choice(cities), "founded": rng.randint(1890, 2015),
                          "industry": rng.choice(INDUSTRIES)} for c in companies},
        "people": {p: {"born_in": rng.choice(cities), "company": rng.choice(companies),
                       "role": rng.choice(ROLES), "born": rng.randint(1940, 2000)} for p in people},
    }
    return world


def world_documents(world: dict) -> list[dict]:
    """Returns the documents [{docid, title, text}] stating the world's facts (one entity each)."""
    docs = []

    def add(kind, title, text):
        docs.append({"docid": f"{kind}-{len(docs):04d}", "title": title, "text": text})

    for p, f in world["people"].items():
        add("person", p, f"{p} was born in {f['born_in']} in {f['born']}. {p} works as "
                         f"a {f['role']} at {f['company']}.")
    for c, f in world["companies"].items():
        add("company", c, f"{c} is a {f['industry']} company founded in {f['founded']}. "
                          f"Its headquarters are in the city of {f['city']}.")
    for c, f in world["cities"].items():
        add("city", c, f"{c} is a city in {f['country']} with about {f['population']:,} "
                       f"inhabitants.")
    for c, f in world["countries"].items():
        add("country", c, f"{c} is a country on the continent of {f['continent']}. "
                          f"The capital of {c} is {f['capital']}.")
    return docs


# ----------------------------------------------------------------------------- corpora
class Corpus:
    """Documents plus their BM25 index (rank_bm25.BM25Okapi over `tokenize`)."""

    def __init__(self, docs: list[dict]):
        from rank_bm25 import BM25Okapi

        if not docs:
            raise ValueError("search corpus is empty: give documents with 'docid' and 'text'")
        self.docs = docs
        self.by_id = {d["docid"]: i for i, d in enumerate(docs)}
        toks = [tokenize(d.get("title", "") + " " + d["text"]) or ["_"] for d in docs]
        self.terms = [frozenset(t) for t in toks]
        self.bm25 = BM25Okapi(toks)

    def search(self, query: str, k: int) -> list[dict]:
        """Returns the top-k docs [{docid, title, snippet, score}] (ties: corpus order).

        Only documents sharing a query term are returned: Okapi's idf goes negative for terms in
        over half the documents, so a score threshold would drop real matches in small corpora.
        """
        q = tokenize(query)
        if not q:
            return []
        scores = self.bm25.get_scores(q)
        qs = set(q)
        hits = [i for i in range(len(self.docs)) if qs & self.terms[i]]
        order = sorted(hits, key=lambda i: (-scores[i], i))[:k]
        return [{"docid": self.docs[i]["docid"], "title": self.docs[i].get("title", ""),
                 "snippet": snippet(self.docs[i]["text"], q), "score": round(float(scores[i]), 4)}
                for i in order]


def snippet(text: str, q_tokens: list[str], limit: int = SNIPPET_CHARS) -> str:
    """Returns the sentence sharing most query terms (then the next ones), cut to `limit`."""
    sents = re.split(r"(?<=[.!?])\s+", text.strip()) or [text]
    qs = set(q_tokens)
    best = max(range(len(sents)), key=lambda i: (len(qs & set(tokenize(sents[i]))), -i))
    out = " ".join(sents[best:])
    return out if len(out) <= limit else out[:limit - 3].rstrip() + "..."


def load_jsonl_corpus(path: str) -> list[dict]:
    """Returns documents from a BrowseComp-Plus-style corpus file or directory."""
    files = [path] if os.path.isfile(path) else (
        [os.path.join(path, "corpus.jsonl")] if os.path.isfile(os.path.join(path, "corpus.jsonl"))
        else sorted(glob.glob(os.path.join(path, "corpus", "*.jsonl"))))
    if not files:
        raise FileNotFoundError(f"no corpus under {path!r}: expected corpus.jsonl or "
                                f"corpus/*.jsonl with lines {{'docid', 'text', 'title'?}}")
    docs = []
    for fp in files:
        with open(fp) as f:
            for n, line in enumerate(f, 1):
                if not line.strip():
                    continue
                d = json.loads(line)
                if "docid" not in d or "text" not in d:
                    raise ValueError(f"{fp}:{n}: a corpus line needs 'docid' and 'text'; got "
                                     f"keys {sorted(d)}")
                docs.append({"docid": str(d["docid"]), "title": str(d.get("title") or ""),
                             "text": str(d["text"]), "url": str(d.get("url") or "")})
    return docs


@functools.lru_cache(maxsize=64)
def get_corpus(seed: int, corpus_dir: str | None = None) -> Corpus:
    """Returns the (cached) corpus: the directory's when given, else the world of `seed`."""
    if corpus_dir:
        return Corpus(load_jsonl_corpus(corpus_dir))
    return Corpus(world_documents(build_world(int(seed))))


# ----------------------------------------------------------------------------- server
class SearchHit(TypedDict):
    docid: str
    title: str
    snippet: str
    score: float


class SearchResults(TypedDict):
    query: str
    results: list[SearchHit]
    count: int


class Document(TypedDict):
    docid: str
    title: str
    text: str


def _init(rng, seed, sandbox):
    corpus_dir = os.environ.get(CORPUS_ENV) or None
    get_corpus(int(seed), corpus_dir)  # build (or fail) at reset, not on the first call
    return {"calls": [], "_corpus": {"seed": int(seed), "dir": corpus_dir}}


def _corpus() -> Corpus:
    key = db()["_corpus"]
    return get_corpus(key["seed"], key["dir"])


DOMAIN = Domain("search", "Web-style document search: BM25 search over a document collection "
                          "and full-document lookup by id.", _init)


@DOMAIN.tool
def search(query: str, k: int = 5) -> SearchResults:
    """Search the document collection; returns up to k documents (docid, title, snippet, score)."""
    if not query.strip():
        fail("'query' must not be empty: give a few keywords, e.g. a name")
    if not 1 <= k <= MAX_K:
        fail(f"'k' must be between 1 and {MAX_K}; got {k}")
    hits = _corpus().search(query, k)
    db()["calls"].append({"tool": "search", "query": query, "docids": [h["docid"] for h in hits]})
    return {"query": query, "results": hits, "count": len(hits)}


@DOMAIN.tool
def get_document(docid: str) -> Document:
    """Get the full text of a document by its docid (from search results)."""
    c = _corpus()
    if docid not in c.by_id:
        fail(f"document '{docid}' not found; use a docid returned by search")
    d = c.docs[c.by_id[docid]]
    db()["calls"].append({"tool": "get_document", "docid": docid})
    return {"docid": d["docid"], "title": d.get("title", ""), "text": d["text"]}


def corpus_for(seed: int) -> Any:
    """Returns the corpus an episode with `seed` sees in this process (tests, task generation)."""
    return get_corpus(int(seed), os.environ.get(CORPUS_ENV) or None)
