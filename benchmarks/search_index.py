"""Search server index: bm25s (built once, saved, memory-mapped) against rank-bm25 (the baseline:
the index every search server process used to build in its first reset).

    python -m benchmarks.search_index                 # 100,000 synthetic documents, 200 queries
    python -m benchmarks.search_index --quick         # 5,000 documents, 100 queries
    python -m benchmarks.search_index --docs 20000 --queries 50

Writes a synthetic BrowseComp-Plus-style corpus (corpus.jsonl: Zipf-distributed pseudo-words,
40-160 tokens a document) to a temp dir, tokenizes it once with the server's `tokenize`, then
times, in this process and on the same token lists: rank_bm25.BM25Okapi against the server's
`build_bm25` (bm25s's index arrays, made with whole-corpus numpy ops) (`build_s`), and the
whole saved-index build (read + tokenize + index + write, what
`--build-index` costs once: `build_and_save_s`). Then one fresh process per library plays a
search server worker: rank-bm25's reads the corpus, tokenizes it and builds its index (what each
worker did); bm25s's loads the saved index with mmap (`load_mmap_s`). Each runs the same queries
(2-4 words of a random document), timing the library's top-k (`query_ms_median`: scores + top-k)
and the server's whole `Corpus.search` (`search_ms_median`: with snippets; rank-bm25's is the
search code this server had before), and reports its RSS after loading, after the queries, and
its peak. `top1_agreement`, `top10_overlap` and `old_top1_in_new_top10` compare the two
servers' result lists (the scores differ: Lucene idf against Okapi's, floored at 0.25 x mean).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _log(msg: str) -> None:
    print(f"[search_index] {msg}", file=sys.stderr, flush=True)


def _status_mb(field: str) -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return round(int(line.split()[1]) / 1024, 1)
    return float("nan")


def _rss_mb() -> float:
    return _status_mb("VmRSS")


def _peak_rss_mb() -> float:
    # VmHWM, not ru_maxrss: a child's ru_maxrss can start at its parent's RSS (fork, then exec)
    return _status_mb("VmHWM")


def make_corpus(n_docs: int, vocab: int, seed: int) -> list[dict]:
    """Returns the documents [{docid, title, text}] of a synthetic corpus."""
    from toolverse_jax.envs.builtin.search import tokenize

    rng = np.random.default_rng(seed)
    letters = np.array(list("abcdefghijklmnopqrstuvwxyz"))
    words: list[str] = []
    seen: set = set()
    while len(words) < vocab:
        w = "".join(rng.choice(letters, rng.integers(3, 10)))
        if w not in seen and tokenize(w) == [w]:  # not a stop word
            seen.add(w)
            words.append(w)
    p = 1.0 / np.arange(1, vocab + 1) ** 1.07
    p /= p.sum()
    lens = rng.integers(40, 161, n_docs)
    flat = rng.choice(vocab, size=int(lens.sum()), p=p)
    docs, pos = [], 0
    for i, n in enumerate(lens):
        ids = flat[pos:pos + n]
        pos += n
        sents = [" ".join(words[j] for j in ids[a:a + 16]).capitalize() + "."
                 for a in range(0, n, 16)]
        docs.append({"docid": f"doc{i:07d}", "title": " ".join(words[j] for j in ids[:3]).title(),
                     "text": " ".join(sents)})
    return docs


def make_queries(docs: list[dict], n: int, seed: int) -> list[str]:
    """Returns `n` queries of 2-4 words drawn from random documents."""
    rng = np.random.default_rng(seed + 1)
    out = []
    for i in rng.integers(0, len(docs), n):
        w = docs[i]["text"].replace(".", "").lower().split()
        out.append(" ".join(rng.choice(w, rng.integers(2, 5), replace=False)))
    return out


def okapi_search(bm25, terms: list[frozenset], docs: list[dict], query: str, k: int) -> list:
    """The search server's `Corpus.search` as it was over rank_bm25 (the baseline)."""
    from toolverse_jax.envs.builtin.search import snippet, tokenize

    q = tokenize(query)
    if not q:
        return []
    scores = bm25.get_scores(q)
    qs = set(q)
    hits = [i for i in range(len(docs)) if qs & terms[i]]
    order = sorted(hits, key=lambda i: (-scores[i], i))[:k]
    return [{"docid": docs[i]["docid"], "title": docs[i].get("title", ""),
             "snippet": snippet(docs[i]["text"], q), "score": round(float(scores[i]), 4)}
            for i in order]


def worker(lib: str, corpus_dir: str, k: int) -> dict:
    """One search server process's start and queries with `lib` ("bm25s" or "rank_bm25")."""
    t0 = time.perf_counter()
    from toolverse_jax.envs.builtin import search as srv
    import_s = time.perf_counter() - t0
    rss0 = _rss_mb()
    with open(os.path.join(corpus_dir, "queries.json")) as f:
        queries = json.load(f)
    t1 = time.perf_counter()
    if lib == "bm25s":
        corpus = srv.open_corpus(corpus_dir)
        assert corpus.index_dir, "no saved index found"
        load_s = time.perf_counter() - t1
        bm = corpus.bm25
        vocab = bm.vocab_dict

        def raw(q):  # the library's own scoring + top-k
            ids = [vocab[t] for t in srv.tokenize(q) if t in vocab]
            s = bm.get_scores(ids) if ids else np.zeros(len(corpus.docs), np.float32)
            return np.argpartition(-s, k)[:k]

        def search(q):
            return corpus.search(q, k)
    else:
        from rank_bm25 import BM25Okapi

        docs = srv.load_jsonl_corpus(corpus_dir)
        toks = [srv.tokenize(d["title"] + " " + d["text"]) or ["_"] for d in docs]
        terms = [frozenset(t) for t in toks]
        okapi = BM25Okapi(toks)
        load_s = time.perf_counter() - t1

        def raw(q):
            s = okapi.get_scores(srv.tokenize(q))
            return np.argpartition(-s, k)[:k]

        def search(q):
            return okapi_search(okapi, terms, docs, q, k)
    rss_loaded = _rss_mb()
    raw_ms, search_ms, results = [], [], []
    for q in queries:
        a = time.perf_counter()
        raw(q)
        b = time.perf_counter()
        hits = search(q)
        c = time.perf_counter()
        raw_ms.append((b - a) * 1e3)
        search_ms.append((c - b) * 1e3)
        results.append([h["docid"] for h in hits])
    return {"lib": lib, "import_s": round(import_s, 3), "load_s": round(load_s, 3),
            "rss_before_load_mb": rss0, "rss_loaded_mb": rss_loaded, "rss_after_queries_mb":
            _rss_mb(), "peak_rss_mb": _peak_rss_mb(),
            "query_ms_median": round(statistics.median(raw_ms), 3),
            "search_ms_median": round(statistics.median(search_ms), 3), "results": results}


def _run_worker(lib: str, corpus_dir: str, k: int, timeout_s: float) -> dict:
    cmd = [sys.executable, "-m", "benchmarks.search_index", "--worker", lib, "--dir", corpus_dir,
           "--k", str(k)]
    env = {**os.environ, "TOOLVERSE_SEARCH_INDEX": os.path.join(corpus_dir, "index")}
    p = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout_s)
    if p.returncode != 0:
        raise RuntimeError(f"{lib} worker failed ({p.returncode}): {p.stderr[-2000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def run(a: argparse.Namespace) -> dict:
    """Returns the benchmark's JSON record for parsed `args` (see `parse_args`); without rank-bm25
    installed, the bm25s half with the baseline marked skipped."""
    try:
        from rank_bm25 import BM25Okapi
    except ImportError:
        BM25Okapi = None
    from toolverse_jax.envs.builtin import search as srv

    libs = ("bm25s", "rank_bm25") if BM25Okapi is not None else ("bm25s",)
    root = tempfile.mkdtemp(prefix="bench_search_index_")
    env_before = os.environ.get(srv.INDEX_ENV)
    os.environ[srv.INDEX_ENV] = os.path.join(root, "index")
    try:
        t0 = time.perf_counter()
        docs = make_corpus(a.docs, a.vocab, a.seed)
        queries = make_queries(docs, a.queries, a.seed)
        with open(os.path.join(root, "corpus.jsonl"), "w") as f:
            for d in docs:
                f.write(json.dumps(d) + "\n")
        with open(os.path.join(root, "queries.json"), "w") as f:
            json.dump(queries, f)
        corpus_mb = os.path.getsize(os.path.join(root, "corpus.jsonl")) / 2**20
        _log(f"{a.docs} docs ({corpus_mb:.1f} MB), {len(queries)} queries in "
             f"{time.perf_counter() - t0:.1f} s")

        t0 = time.perf_counter()
        toks = [srv.tokenize(d["title"] + " " + d["text"]) or ["_"] for d in docs]
        tokenize_s = time.perf_counter() - t0
        del docs
        srv._bm25s()  # import outside the timings
        builds: dict = {lib: [] for lib in libs}
        for r in range(a.rounds):  # alternate the order so both see the same machine load
            for lib in (libs if r % 2 == 0 else libs[::-1]):
                t0 = time.perf_counter()
                idx = srv.build_bm25(toks) if lib == "bm25s" else BM25Okapi(toks)
                builds[lib].append(time.perf_counter() - t0)
                del idx
                _log(f"round {r} {lib}: build {builds[lib][-1]:.2f} s")
        avg_len = float(np.mean([len(t) for t in toks]))
        del toks

        t0 = time.perf_counter()
        index_dir = srv.ensure_index(root)
        build_and_save_s = time.perf_counter() - t0
        with open(os.path.join(index_dir, "manifest.json")) as f:
            m = json.load(f)
        index_mb = sum(r["size"] for r in m["files"].values()) / 2**20
        _log(f"saved index: {build_and_save_s:.2f} s, {index_mb:.1f} MB")

        w = {}
        for lib in libs:
            w[lib] = _run_worker(lib, root, a.k, a.worker_timeout)
            _log(f"{lib} worker: load {w[lib]['load_s']} s, query {w[lib]['query_ms_median']} ms, "
                 f"search {w[lib]['search_ms_median']} ms, peak RSS {w[lib]['peak_rss_mb']} MB")
    finally:
        shutil.rmtree(root, ignore_errors=True)
        if env_before is None:
            os.environ.pop(srv.INDEX_ENV, None)
        else:
            os.environ[srv.INDEX_ENV] = env_before

    med = {lib: float(np.median(v)) for lib, v in builds.items()}
    b = w["bm25s"]
    new = b.pop("results")
    out: dict = {"benchmark": "search_index"}
    if BM25Okapi is not None:
        r = w["rank_bm25"]
        old = r.pop("results")
        out.update({
            "build_speedup": round(med["rank_bm25"] / med["bm25s"], 2),
            "worker_start_speedup": round(r["load_s"] / max(b["load_s"], 1e-9), 1),
            "query_speedup": round(r["query_ms_median"] / max(b["query_ms_median"], 1e-9), 1),
            "search_speedup": round(r["search_ms_median"] / max(b["search_ms_median"], 1e-9), 1),
            "top1_agreement": round(float(np.mean([x[:1] == y[:1] for x, y in zip(new, old)])), 3),
            "top10_overlap": round(float(np.mean([len(set(x) & set(y)) / max(len(y), 1)
                                                  for x, y in zip(new, old)])), 3),
            "old_top1_in_new_top10": round(float(np.mean([y[:1] == [] or y[0] in x
                                                          for x, y in zip(new, old)])), 3)})
        baseline = {"build_s": round(med["rank_bm25"], 3), "worker_load_tokenize_build_s":
                    r["load_s"], **{k: v for k, v in r.items() if k not in ("lib", "load_s")},
                    "version": _version("rank-bm25")}
    else:
        baseline = {"skipped": "rank-bm25 not installed (pip install rank-bm25==0.2.2; it is in "
                               "the test extra)"}
    out.update({
        "config": {"docs": a.docs, "queries": len(queries), "k": a.k, "vocab": a.vocab,
                   "avg_doc_tokens": round(avg_len, 1), "corpus_mb": round(corpus_mb, 1),
                   "rounds": a.rounds, "seed": a.seed},
        "tokenize_s": round(tokenize_s, 3),
        "bm25s": {"build_s": round(med["bm25s"], 3), "build_and_save_s": round(build_and_save_s, 3),
                  "index_mb": round(index_mb, 1), "load_mmap_s": b["load_s"],
                  **{k: v for k, v in b.items() if k not in ("lib", "load_s")},
                  "version": srv._bm25s_version()},
        "rank_bm25": baseline,
        "cpu_count": os.cpu_count(), "loadavg": [round(x, 2) for x in os.getloadavg()],
        "quick": bool(a.quick),
    })
    return out


def _version(dist: str) -> str:
    from importlib.metadata import version
    return version(dist)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--docs", type=int, default=100_000)
    p.add_argument("--queries", type=int, default=200)
    p.add_argument("--k", type=int, default=10)
    p.add_argument("--vocab", type=int, default=50_000, help="pseudo-words (Zipf-distributed)")
    p.add_argument("--rounds", type=int, default=2, help="in-process builds per library")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--worker-timeout", type=float, default=1800.0)
    p.add_argument("--quick", action="store_true", help="5,000 documents, 100 queries, 1 round")
    p.add_argument("--worker", choices=("bm25s", "rank_bm25"), help=argparse.SUPPRESS)
    p.add_argument("--dir", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.quick:
        a.docs, a.queries, a.rounds, a.vocab = 5000, 100, 1, 20_000
    if a.k >= a.docs:
        p.error("--k must be below --docs")
    return a


def main(argv=None) -> dict:
    a = parse_args(argv)
    out = worker(a.worker, a.dir, a.k) if a.worker else run(a)
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    main()
