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

BM25 is bm25s's (Lucene variant, k1=1.5, b=0.75) over `tokenize`'s tokens. A synthetic world's
index is built in memory (a few dozen documents). A directory corpus's index is built once, saved
(beside the corpus in .bm25s_index/, or under TOOLVERSE_SEARCH_INDEX) and memory-mapped by every
server process, which reads documents from the corpus files only when it returns them; prebuild it
with

    python -m toolverse_jax.envs.builtin.search --build-index DIR   # [--rebuild] [--verify]

(`tasks.search_tasks.load_browsecomp_plus` does it too). A stale or corrupt saved index is rebuilt,
never used. Corpora are cached per process (the episode state only records the corpus key and the
calls made), so many episodes share one index.
"""

from __future__ import annotations

import array
import collections
import functools
import glob
import hashlib
import json
import logging
import math
import operator
import os
import random
import re
import resource
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
from typing_extensions import TypedDict

from toolverse_jax.envs.builtin.base import Domain, db, fail

CORPUS_ENV = "TOOLVERSE_SEARCH_CORPUS"
MAX_K = 20
SNIPPET_CHARS = 240
BM25_K1, BM25_B = 1.5, 0.75

log = logging.getLogger(__name__)

_TOKEN_RE = re.compile(r"[a-z0-9]+")
_STOP = frozenset("a an and are as at be by for from in is it of on or that the this to was "
                  "were which who whom what when where with".split())


def tokenize(text: str) -> list[str]:
    """Returns lower-cased word tokens without stop words (the BM25 analyzer)."""
    return [w for w in _TOKEN_RE.findall(text.lower()) if w not in _STOP]


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


# ----------------------------------------------------------------------------- BM25 (bm25s)
_BM25S_LOCK = threading.Lock()


def _bm25s():
    """Returns the bm25s module, imported without letting it start JAX (or load scipy).

    bm25s.selection runs `jax.lax.top_k` at import whenever `import jax` works: in a search server
    process that would import JAX (~3 s) and initialize its backends (on a GPU host, claiming
    device memory) in every worker. bm25s falls back to numpy when those imports fail, so here they
    fail unless this process already imported them; everything we call is numpy-only.
    """
    mod = sys.modules.get("bm25s")
    if mod is not None:
        return mod
    with _BM25S_LOCK:
        hidden = [m for m in ("jax", "scipy") if m not in sys.modules]
        for m in hidden:
            sys.modules[m] = None  # `import m` raises ImportError while importing bm25s
        try:
            import bm25s
        finally:
            for m in hidden:
                if m in sys.modules and sys.modules[m] is None:
                    del sys.modules[m]
        logging.getLogger("bm25s").setLevel(logging.WARNING)  # bm25s sets DEBUG at import
    return bm25s


def build_bm25(token_lists: Iterable[list[str]]):
    """Returns an in-memory bm25s.BM25 (Lucene BM25, k1=1.5, b=0.75) over pre-tokenized docs.

    The arrays are those `bm25s.BM25.index` makes from the same tokens (bit for bit: see
    tests/test_search_env.py), computed with whole-corpus numpy ops instead of bm25s's loop over
    documents (a Counter and a few small numpy calls each: 3x slower than rank_bm25 at 100k
    documents). `token_lists` is consumed once, so a generator keeps only the token ids around.
    """
    ids: collections.defaultdict = collections.defaultdict()
    ids.default_factory = ids.__len__  # a new token gets the next id, all in C
    get = ids.__getitem__
    flat, lens = array.array("i"), array.array("q")
    for toks in token_lists:
        flat.extend(map(get, toks))
        lens.append(len(toks))
    vocab = dict(ids)
    del ids, get
    n, nv = len(lens), len(vocab)
    if n == 0:
        raise ValueError("search corpus is empty: give documents with 'docid' and 'text'")
    dl = np.frombuffer(lens, dtype=np.int64)
    # (term, doc) pairs with their term frequency, sorted by term then doc: CSC order
    pair, tf = np.unique(np.frombuffer(flat, dtype=np.int32).astype(np.int64) * n
                         + np.repeat(np.arange(n, dtype=np.int64), dl), return_counts=True)
    del flat
    col, row = np.divmod(pair, n)
    del pair
    df = np.bincount(col, minlength=nv)
    # as bm25s: idf in Python floats (math.log), stored float32; tf part in float64
    idf = np.array([math.log(1 + (n - d + 0.5) / (d + 0.5)) for d in df.tolist()], np.float32)
    avg = np.array(lens).mean()
    tf = tf.astype(np.float32)
    tfc = tf / (BM25_K1 * ((1 - BM25_B) + BM25_B * dl[row] / avg) + tf)
    indptr = np.zeros(nv + 1, dtype=np.int64)
    np.cumsum(df, out=indptr[1:])
    bm = _bm25s().BM25(k1=BM25_K1, b=BM25_B, method="lucene", csc_backend="numpy")
    bm.scores = {"data": (idf[col] * tfc).astype(np.float32), "indices": row.astype(np.int32),
                 "indptr": indptr, "num_docs": n}
    bm.vocab_dict = vocab
    bm.unique_token_ids_set = set(vocab.values())
    bm.nonoccurrence_array = None
    return bm


def _doc_tokens(d: dict) -> list[str]:
    return tokenize(d.get("title", "") + " " + d["text"]) or ["_"]  # "_": never a query token


# ----------------------------------------------------------------------------- corpora
class Corpus:
    """Documents plus their BM25 index: a bm25s.BM25 (Lucene BM25 over `tokenize`'s tokens),
    built in memory from `docs` or given (`bm25`, e.g. a saved index loaded with mmap).

    `docs` is a sequence of {docid, title, text, url?} dicts (a list, or `LazyDocs` reading them
    from the corpus files on access); `docids` (default: read off `docs`) lists their ids in order.
    """

    def __init__(self, docs: Sequence[dict], bm25=None, docids: list[str] | None = None,
                 index_dir: str | None = None):
        if not len(docs):
            raise ValueError("search corpus is empty: give documents with 'docid' and 'text'")
        self.docs = docs
        docids = [d["docid"] for d in docs] if docids is None else docids
        self.by_id = {d: i for i, d in enumerate(docids)}
        self.bm25 = build_bm25([_doc_tokens(d) for d in docs]) if bm25 is None else bm25
        self.index_dir = index_dir  # the saved index in use, None when built in memory
        if int(self.bm25.scores["num_docs"]) != len(docs):
            raise ValueError(f"BM25 index has {self.bm25.scores['num_docs']} documents, the corpus "
                             f"{len(docs)}")

    def search(self, query: str, k: int) -> list[dict]:
        """Returns the top-k docs [{docid, title, snippet, score}] (ties: corpus order).

        Only documents sharing a query term are returned (the postings of the query's terms), not
        every document with a score: with Okapi's idf (the rank_bm25 index this replaced) a term in
        over half the documents scores negative, so a score threshold dropped real matches in small
        corpora. Scores equal bm25s's `get_scores` (each query token occurrence adds its column).
        """
        q = tokenize(query)
        vocab = self.bm25.vocab_dict
        ids = [vocab[t] for t in q if t in vocab]
        if not ids or k < 1:
            return []
        sc = self.bm25.scores
        indptr, indices, data = sc["indptr"], sc["indices"], sc["data"]
        n = int(sc["num_docs"])
        scores = np.zeros(n, dtype=data.dtype)
        hit = np.zeros(n, dtype=bool)
        for t in ids:
            a, b = int(indptr[t]), int(indptr[t + 1])
            rows = indices[a:b]
            scores[rows] += data[a:b]  # a column lists each document once: no np.add.at needed
            hit[rows] = True
        hits = np.flatnonzero(hit)
        hs = scores[hits]
        if len(hits) > k:  # keep everything tied with the k-th best, then order exactly
            kth = np.partition(hs, len(hs) - k)[len(hs) - k]
            keep = np.flatnonzero(hs >= kth)
            hits, hs = hits[keep], hs[keep]
        order = np.lexsort((hits, -hs))[:k]
        out = []
        for j in order:
            d = self.docs[int(hits[j])]
            out.append({"docid": d["docid"], "title": d.get("title", ""),
                        "snippet": snippet(d["text"], q), "score": round(float(hs[j]), 4)})
        return out


def snippet(text: str, q_tokens: list[str], limit: int = SNIPPET_CHARS) -> str:
    """Returns the sentence sharing most query terms (then the next ones), cut to `limit`."""
    sents = re.split(r"(?<=[.!?])\s+", text.strip()) or [text]
    qs = set(q_tokens)
    best = max(range(len(sents)), key=lambda i: (len(qs & set(tokenize(sents[i]))), -i))
    out = " ".join(sents[best:])
    return out if len(out) <= limit else out[:limit - 3].rstrip() + "..."


def corpus_files(path: str) -> list[str]:
    """Returns the JSONL files of a BrowseComp-Plus-style corpus file or directory, in order."""
    files = [path] if os.path.isfile(path) else (
        [os.path.join(path, "corpus.jsonl")] if os.path.isfile(os.path.join(path, "corpus.jsonl"))
        else sorted(glob.glob(os.path.join(path, "corpus", "*.jsonl"))))
    if not files:
        raise FileNotFoundError(f"no corpus under {path!r}: expected corpus.jsonl or "
                                f"corpus/*.jsonl with lines {{'docid', 'text', 'title'?}}")
    return files


def _parse_doc(line: str | bytes, fp: str, n: int | str) -> dict:
    d = json.loads(line)
    if "docid" not in d or "text" not in d:
        raise ValueError(f"{fp}:{n}: a corpus line needs 'docid' and 'text'; got keys {sorted(d)}")
    return {"docid": str(d["docid"]), "title": str(d.get("title") or ""), "text": str(d["text"]),
            "url": str(d.get("url") or "")}


def load_jsonl_corpus(path: str) -> list[dict]:
    """Returns documents from a BrowseComp-Plus-style corpus file or directory."""
    docs = []
    for fp in corpus_files(path):
        with open(fp) as f:
            for n, line in enumerate(f, 1):
                if line.strip():
                    docs.append(_parse_doc(line, fp, n))
    return docs


class LazyDocs(Sequence):
    """A saved-index corpus's documents, each read from its corpus file when accessed (`os.pread`
    at the byte range the index recorded), so a server process neither parses nor holds the
    corpus. A document whose docid differs from the index's means the file changed underneath:
    that raises, never returns another document."""

    def __init__(self, files: list[str], file_idx, start, end, docids: list[str]):
        self.files, self.file_idx, self.start, self.end = files, file_idx, start, end
        self.docids = docids
        self._fds: dict[int, int] = {}

    def __len__(self) -> int:
        return len(self.docids)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        i = operator.index(i)
        if i < 0:
            i += len(self)
        if not 0 <= i < len(self):
            raise IndexError(f"document {i} out of range (corpus of {len(self)})")
        f, a, b = int(self.file_idx[i]), int(self.start[i]), int(self.end[i])
        if f not in self._fds:
            self._fds[f] = os.open(self.files[f], os.O_RDONLY)
        raw = os.pread(self._fds[f], b - a, a)
        try:
            d = _parse_doc(raw, self.files[f], f"byte {a}")
        except ValueError as e:  # JSONDecodeError too
            raise RuntimeError(f"{self.files[f]} changed since its search index was built ({e}); "
                               f"rebuild it: {_BUILD_HINT}") from None
        if d["docid"] != self.docids[i]:
            raise RuntimeError(f"{self.files[f]} changed since its search index was built (docid "
                               f"{d['docid']!r} where the index has {self.docids[i]!r}); rebuild "
                               f"it: {_BUILD_HINT}")
        return d

    def __del__(self):
        for fd in getattr(self, "_fds", {}).values():
            try:
                os.close(fd)
            except OSError:
                pass


# ----------------------------------------------------------------------------- saved indexes
# A directory corpus's index is built once (`python -m toolverse_jax.envs.builtin.search
# --build-index DIR`, `ensure_index`, or the first process that opens the corpus where it may
# write), saved, and memory-mapped by every server process. Layout: ROOT/<fingerprint>/ holding
# bm25s's files (data/indices/indptr .npy, vocab and params .json), the documents' byte ranges
# (doc_file/doc_start/doc_end .npy), docids.json and, written last, manifest.json (sizes and
# sha256 of every file). The fingerprint hashes the corpus files' names, sizes and mtimes with the
# analyzer, BM25 parameters, bm25s version and INDEX_FORMAT, so a changed corpus finds no index
# and builds a new one. An index is written into a temporary directory and renamed into place, so
# readers never see half of one; one whose files do not match its manifest is rebuilt.
INDEX_ENV = "TOOLVERSE_SEARCH_INDEX"   # a directory for saved indexes (default: beside the corpus)
INDEX_DIRNAME = ".bm25s_index"
INDEX_FORMAT = 1
_MANIFEST = "manifest.json"
_BUILD_HINT = "python -m toolverse_jax.envs.builtin.search --build-index <corpus dir>"
_DOC_ARRAYS = ("doc_file.npy", "doc_start.npy", "doc_end.npy")


class StaleIndexError(ValueError):
    """A saved index that does not match its manifest or corpus (stale, partial or corrupt)."""


def _analyzer_id() -> str:
    return hashlib.sha256(json.dumps([_TOKEN_RE.pattern, sorted(_STOP)]).encode()).hexdigest()[:16]


def corpus_fingerprint(path: str) -> tuple[str, list[str]]:
    """Returns (fingerprint, files) of the corpus at `path` (see the layout note above)."""
    files = corpus_files(path)
    root = path if os.path.isdir(path) else os.path.dirname(os.path.abspath(path))
    stats = []
    for fp in files:
        st = os.stat(fp)
        stats.append([os.path.relpath(fp, root), st.st_size, st.st_mtime_ns])
    key = {"format": INDEX_FORMAT, "bm25s": _bm25s_version(), "analyzer": _analyzer_id(),
           "k1": BM25_K1, "b": BM25_B, "method": "lucene", "files": stats}
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:32], files


def _bm25s_version() -> str:
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version("bm25s")
    except PackageNotFoundError:  # imported from a path: ask the module
        return _bm25s().__version__


def _corpus_key(path: str) -> str:
    return hashlib.sha256(os.path.realpath(path).encode()).hexdigest()[:16]


def index_roots(path: str) -> list[str]:
    """Returns where saved indexes of the corpus at `path` are looked for, in order: INDEX_ENV
    when set, else beside the corpus (DIR/.bm25s_index) then the user cache
    ($TOOLVERSE_CACHE or ~/.cache, /toolverse_jax/search_index) for read-only corpora."""
    if os.environ.get(INDEX_ENV):
        return [os.environ[INDEX_ENV]]
    base = path if os.path.isdir(path) else os.path.dirname(os.path.abspath(path))
    cache = os.environ.get("TOOLVERSE_CACHE", os.path.join(os.path.expanduser("~"), ".cache"))
    return [os.path.join(base, INDEX_DIRNAME), os.path.join(cache, "toolverse_jax", "search_index")]


def _sha256(fp: str) -> str:
    h = hashlib.sha256()
    with open(fp, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


def load_index(index_dir: str, path: str, fingerprint: str | None = None, full: bool = False
               ) -> Corpus:
    """Returns the corpus at `path` served from its saved index `index_dir` (arrays mmapped).

    Checks the manifest (format, fingerprint, every file's size, the sha256 of the JSON files;
    of every file with `full`) and the arrays' shapes; raises `StaleIndexError` on any mismatch.
    """
    if fingerprint is None:
        fingerprint, files = corpus_fingerprint(path)
    else:
        files = corpus_files(path)
    try:
        with open(os.path.join(index_dir, _MANIFEST)) as f:
            m = json.load(f)
    except (OSError, ValueError) as e:
        raise StaleIndexError(f"no readable {_MANIFEST} in {index_dir} ({e})") from None
    if not isinstance(m, dict) or m.get("format") != INDEX_FORMAT or \
            m.get("fingerprint") != fingerprint:
        got = m.get("fingerprint") if isinstance(m, dict) else None
        raise StaleIndexError(f"{index_dir} was built for another state of the corpus or another "
                              f"index format (fingerprint {got!r}, want {fingerprint!r})")
    try:
        recs = {str(k): (int(v["size"]), str(v["sha256"])) for k, v in m["files"].items()}
        n, num_files = int(m["num_docs"]), int(m["num_files"])
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise StaleIndexError(f"{index_dir}/{_MANIFEST} is malformed ({e!r})") from None
    missing = {"docids.json", "params.index.json", "vocab.index.json", *_DOC_ARRAYS} - set(recs)
    if missing:
        raise StaleIndexError(f"{index_dir}/{_MANIFEST} lacks {sorted(missing)}")
    for name, (size, sha) in recs.items():
        fp = os.path.join(index_dir, name)
        try:
            got = os.path.getsize(fp)
        except OSError:
            raise StaleIndexError(f"{fp} is missing") from None
        if got != size:
            raise StaleIndexError(f"{fp} has {got} bytes, its manifest says {size}")
        if (full or name.endswith(".json")) and _sha256(fp) != sha:
            raise StaleIndexError(f"{fp} does not match its sha256 in the manifest")
    try:
        bm = _bm25s().BM25.load(index_dir, mmap=True, show_progress=False)
        with open(os.path.join(index_dir, "docids.json")) as f:
            docids = json.load(f)
        arrs = [np.load(os.path.join(index_dir, a), mmap_mode="r") for a in _DOC_ARRAYS]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise StaleIndexError(f"cannot load the index in {index_dir}: {type(e).__name__}: "
                              f"{e}") from None
    sc = bm.scores
    nnz = sc["data"].shape[0]
    checks = {"docs": n == len(docids) == sc["num_docs"] and all(a.shape == (n,) for a in arrs),
              "indptr": sc["indptr"].shape == (len(bm.vocab_dict) + 1,) and
              int(sc["indptr"][0]) == 0 and int(sc["indptr"][-1]) == nnz,
              "indices": sc["indices"].shape == (nnz,),
              "files": len(files) == num_files}
    bad = [k for k, ok in checks.items() if not ok]
    if bad:
        raise StaleIndexError(f"the index in {index_dir} is inconsistent ({', '.join(bad)})")
    return Corpus(LazyDocs(files, *arrs, docids), bm25=bm, docids=docids, index_dir=index_dir)


def _find_index(path: str, fingerprint: str, roots: list[str]) -> tuple[Corpus | None, list]:
    """Returns (the corpus from the first valid saved index under `roots` or None, problems)."""
    problems = []
    for root in roots:
        d = os.path.join(root, fingerprint)
        if os.path.isdir(d):
            try:
                return load_index(d, path, fingerprint), problems
            except StaleIndexError as e:
                problems.append(str(e))
    return None, problems


def _writable_files() -> bool:
    # A server under isolate.py's file-size limit would be killed (SIGXFSZ) writing a big index.
    return resource.getrlimit(resource.RLIMIT_FSIZE)[0] == resource.RLIM_INFINITY


def _fsync(fp: str) -> None:
    fd = os.open(fp, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _scan_corpus(files: list[str], out: dict):
    """Yields the token list of each document of the corpus files, recording in `out` its docid,
    file and byte range (so a build holds only token ids, never the documents)."""
    for k in ("docids", "file", "start", "end"):
        out[k] = []
    for i, fp in enumerate(files):
        off = 0
        with open(fp, "rb") as f:
            for n, raw in enumerate(f, 1):
                a, off = off, off + len(raw)
                if not raw.strip():
                    continue
                d = _parse_doc(raw, fp, n)
                out["docids"].append(d["docid"])
                out["file"].append(i)
                out["start"].append(a)
                out["end"].append(off)
                yield _doc_tokens(d)


def _write_index(root: str, path: str, fingerprint: str, files: list[str]) -> str:
    """Builds the index of `path` into a temp dir under `root` and renames it to
    root/<fingerprint> (moving a previous, invalid one aside first); returns that path."""
    tmp = tempfile.mkdtemp(prefix=f".tmp-{fingerprint[:12]}-", dir=root)
    try:
        meta: dict = {}
        bm = build_bm25(_scan_corpus(files, meta))
        docids = meta["docids"]
        bm.save(tmp, show_progress=False)
        for name, key, dtype in zip(_DOC_ARRAYS, ("file", "start", "end"),
                                    (np.int32, np.int64, np.int64)):
            np.save(os.path.join(tmp, name), np.asarray(meta[key], dtype))
        with open(os.path.join(tmp, "docids.json"), "w") as f:
            json.dump(docids, f)
        names = sorted(os.listdir(tmp))
        for name in names:
            _fsync(os.path.join(tmp, name))
        manifest = {"format": INDEX_FORMAT, "fingerprint": fingerprint,
                    "corpus": os.path.realpath(path), "corpus_key": _corpus_key(path),
                    "num_docs": len(docids), "num_files": len(files),
                    "vocab_size": len(bm.vocab_dict), "nnz": int(bm.scores["data"].shape[0]),
                    "bm25": {"k1": BM25_K1, "b": BM25_B, "method": "lucene",
                             "bm25s": _bm25s_version()},
                    "built_at": time.time(),
                    "files": {n: {"size": os.path.getsize(os.path.join(tmp, n)),
                                  "sha256": _sha256(os.path.join(tmp, n))} for n in names}}
        with open(os.path.join(tmp, _MANIFEST), "w") as f:
            json.dump(manifest, f, indent=1)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o755)  # mkdtemp makes it 0700: let other users' workers read it
        final = os.path.join(root, fingerprint)
        if os.path.lexists(final):  # invalid (the caller checked under the lock): move it aside
            aside = tempfile.mkdtemp(prefix=f".old-{fingerprint[:12]}-", dir=root)
            os.rename(final, os.path.join(aside, "index"))
            shutil.rmtree(aside, ignore_errors=True)
        os.rename(tmp, final)
        _fsync(root)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    _prune(root, path, fingerprint)
    return final


def _prune(root: str, path: str, keep: str) -> None:
    """Removes this corpus's other (stale) indexes under `root`, and day-old temp dirs."""
    key = _corpus_key(path)
    for name in os.listdir(root):
        d = os.path.join(root, name)
        if name == keep or not os.path.isdir(d):
            continue
        try:
            if name.startswith((".tmp-", ".old-")):
                stale = time.time() - os.path.getmtime(d) > 86400
            else:
                with open(os.path.join(d, _MANIFEST)) as f:
                    stale = json.load(f).get("corpus_key") == key
        except (OSError, ValueError):
            continue
        if stale:  # a process still mapping its files keeps them until it exits
            shutil.rmtree(d, ignore_errors=True)


def ensure_index(path: str, rebuild: bool = False) -> str:
    """Returns the directory of a valid saved index of the corpus at `path`, building it when
    missing, stale or corrupt (or when `rebuild`), in the first root of `index_roots` that can
    be written. Concurrent callers wait on a lock file while one builds."""
    import fcntl

    fingerprint, _ = corpus_fingerprint(path)
    errors = []
    for root in index_roots(path):
        try:
            os.makedirs(root, exist_ok=True)
            lock = open(os.path.join(root, f"{fingerprint}.lock"), "a")
        except OSError as e:
            errors.append(f"{root}: {e}")
            continue
        with lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            fingerprint, files = corpus_fingerprint(path)  # as it is now, under the lock
            d = os.path.join(root, fingerprint)
            if not rebuild and os.path.isdir(d):
                try:
                    load_index(d, path, fingerprint)
                    return d
                except StaleIndexError as e:
                    log.warning("rebuilding the search index: %s", e)
            try:
                return _write_index(root, path, fingerprint, files)
            except OSError as e:
                errors.append(f"{root}: {e}")
    raise OSError(f"cannot write a search index for {path!r} in any of {index_roots(path)}: "
                  f"{'; '.join(errors)} (set {INDEX_ENV} to a writable directory)")


def open_corpus(path: str) -> Corpus:
    """Returns the corpus at `path` (a BrowseComp-Plus-style directory or .jsonl file) served
    from its saved index (mmapped), building and saving the index first where this process may
    write; else (a sandboxed server) it builds one in memory and logs how to prebuild."""
    fingerprint, _ = corpus_fingerprint(path)
    corpus, problems = _find_index(path, fingerprint, index_roots(path))
    if corpus is not None:
        return corpus
    for p in problems:
        log.warning("ignoring a saved search index: %s", p)
    if _writable_files():
        try:
            return load_index(ensure_index(path), path)
        except OSError as e:
            reason = str(e)
    else:
        reason = "this process has a file-size limit (a sandboxed server)"
    log.warning("search corpus %s: no saved index (%s); building one in memory for this process. "
                "Prebuild it once: %s", path, reason, _BUILD_HINT)
    return Corpus(load_jsonl_corpus(path))


def get_corpus(seed: int, corpus_dir: str | None = None) -> Corpus:
    """Returns the (cached) corpus: the directory's when given (the same for every seed: from its
    saved index, see `open_corpus`), else the world of `seed` (indexed in memory)."""
    if corpus_dir:
        return _dir_corpus(corpus_dir)
    return _world_corpus(int(seed))


@functools.lru_cache(maxsize=8)
def _dir_corpus(corpus_dir: str) -> Corpus:
    return open_corpus(corpus_dir)


@functools.lru_cache(maxsize=64)
def _world_corpus(seed: int) -> Corpus:
    return Corpus(world_documents(build_world(seed)))


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


def main(argv=None) -> dict:
    """CLI: build (or check) the saved BM25 index of a corpus directory; prints one JSON line."""
    import argparse

    p = argparse.ArgumentParser(description="Build the saved BM25 (bm25s) index of a "
                                "BrowseComp-Plus-style corpus once, for every search server.")
    p.add_argument("--build-index", metavar="DIR", required=True,
                   help="corpus directory (corpus.jsonl or corpus/*.jsonl) or .jsonl file")
    p.add_argument("--rebuild", action="store_true", help="build even if a valid index exists")
    p.add_argument("--verify", action="store_true",
                   help="also check every index file's sha256 (reads the whole index)")
    a = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
    t0, started = time.perf_counter(), time.time()
    d = ensure_index(a.build_index, rebuild=a.rebuild)
    with open(os.path.join(d, _MANIFEST)) as f:
        m = json.load(f)
    out = {"corpus": a.build_index, "index": d, "num_docs": m["num_docs"],
           "vocab_size": m["vocab_size"], "nnz": m["nnz"],
           "index_mb": round(sum(r["size"] for r in m["files"].values()) / 2**20, 2),
           "built_now": m["built_at"] >= started,
           "seconds": round(time.perf_counter() - t0, 2)}
    if a.verify:
        load_index(d, a.build_index, full=True)
        out["verified"] = True
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    main()
